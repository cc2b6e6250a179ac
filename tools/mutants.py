"""How strong are the tests? Plant one bug at a time in a copy of the tree and see whether a test fails.

Each mutation below is a mistake a first Transformer makes (a missing 1/sqrt(D),
a mask flipped, the target not shifted, a bias dropped, ...), or its pipeline
(a write not atomic, a resume without the optimizer's state, model.pt not the
best epoch's, ...), written as one exact replacement in one file. For each, the
tree (without .git, .venv and the pipeline's outputs) is copied to a scratch
directory, the replacement made, and the tests that should catch it run with
``pytest -x``: "killed" when one fails, "broken" when pytest could not run them,
"survived" when all pass (then no test can tell the mistake from the real
thing: write one). A mutation names the file it was written for; when its text is no longer
there (the code moved), the one file of lib/, transformer/ and stages/ that holds it exactly once is
mutated instead. "stale" means no file holds it once: update the mutation (``--check`` lists those
without running any test). Prints a JSON line per mutation, then a summary.
Run from the repository root (most take 2-15 s; the training, pipeline and user ones 0.5-3 minutes; the first 65,
46 minutes, the user family's 28, 27 minutes):
    PYTHONPATH=. python tools/mutants.py [--only SUBSTRING ...] [--family numeric] [--workdir /tmp/mutants] [--check]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.mutations import MUTATIONS, NUMERIC, PIPELINE, TRAINING, USER

ROOT = Path(__file__).resolve().parents[1]


def copy_tree(dest: Path):
    """The working tree as it is, without what a mutation cannot touch."""
    if dest.exists():
        shutil.rmtree(dest)
    outputs = {".git", ".venv", ".dvc", "data", "models", "reports", "sources", "exports"}  # at the top only: lib/data

    def ignore(directory: str, names: list[str]) -> set[str]:
        top = Path(directory) == ROOT
        return {name for name in names if (top and name in outputs) or name in ("__pycache__", ".pytest_cache")}

    shutil.copytree(ROOT, dest, ignore=ignore)


def mutated(text: str, old: str, new: str) -> str | None:
    """``text`` with the mistake planted, or None where the mutation is stale: ``old`` is not in ``text`` exactly
    once, or ``new`` plants nothing."""
    return text.replace(old, new) if text.count(old) == 1 and new != old else None


SOURCES = ("lib", "transformer", "stages")  # where a mutation's text is looked for when its file no longer holds it


def locate(root: Path, path: str, old: str) -> str | None:
    """The file under ``root`` to mutate: ``path`` when it holds ``old`` exactly once, else the one source file
    that does; None when there is none (or several)."""
    if (root / path).is_file() and (root / path).read_text(encoding="utf-8").count(old) == 1:
        return path
    holders = [str(file.relative_to(root)) for package in SOURCES for file in sorted((root / package).rglob("*.py"))
               if file.read_text(encoding="utf-8").count(old) == 1]
    return holders[0] if len(holders) == 1 else None


def run(what: str, path: str, old: str, new: str, tests: list[str], tree: Path) -> dict:
    copy_tree(tree)
    found = locate(tree, path, old)
    if found is None or old == new:
        return {"mutation": what, "file": path, "result": "stale"}
    path, source = found, tree / found
    text = source.read_text(encoding="utf-8")
    mutant = mutated(text, old, new)
    source.write_text(mutant, encoding="utf-8")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=tree,
                          capture_output=True, text=True)
    failed = [line.split(" ")[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    if done.returncode not in (0, 1):  # pytest's 1: tests failed; else it could not run them (an import, say)
        return {"mutation": what, "file": path, "result": "broken", "output": done.stdout[-600:] + done.stderr[-600:]}
    return {"mutation": what, "file": path, "result": "killed" if done.returncode else "survived",
            "by": failed[:1], "seconds": round(time.perf_counter() - start, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=[], help="run the mutations whose description holds one of these")
    parser.add_argument("--family", choices=("numeric", "training", "pipeline", "user"),
                        help="only the mutations that run this family's tests (tools/mutations.py's lists)")
    parser.add_argument("--workdir", default=None, help="where the mutated copy goes (default: a temporary directory)")
    parser.add_argument("--check", action="store_true", help="only list the stale mutations (seconds, no tests run)")
    args = parser.parse_args()
    families = {"numeric": NUMERIC, "training": TRAINING, "pipeline": PIPELINE, "user": USER}
    chosen = [m for m in MUTATIONS if (not args.only or any(s in m[0] for s in args.only))
              and (not args.family or m[4] is families[args.family])]
    if not chosen:
        parser.error(f"--only {' '.join(args.only)}: no mutation's description holds it")
    if len({what for what, *_ in MUTATIONS}) != len(MUTATIONS):
        parser.error("two mutations share a description, by which --only picks them")
    if args.check:
        stale = [what for what, path, old, new, _ in chosen if old == new or locate(ROOT, path, old) is None]
        print(json.dumps({"mutations": len(chosen), "stale": stale}))
        return 1 if stale else 0
    if args.workdir:  # made if missing, as the usage line's /tmp/mutants is on a fresh machine
        try:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--workdir {args.workdir}: {err.strerror}")
    results = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        for mutation in chosen:
            results.append(run(*mutation, Path(scratch) / "tree"))
            print(json.dumps(results[-1]), flush=True)
    counts = {k: sum(r["result"] == k for r in results) for k in ("killed", "survived", "stale", "broken")}
    print(json.dumps({"mutations": len(results), **counts,
                      "survivors": [r["mutation"] for r in results if r["result"] == "survived"]}))
    return 1 if counts["survived"] or counts["stale"] or counts["broken"] else 0


if __name__ == "__main__":
    sys.exit(main())
