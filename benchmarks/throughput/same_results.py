"""Does a change leave the results as they were? The pipeline's stages, run in this tree and in another
checkout (the commit before a refactor, say), with the same params, side by side on one machine.

Each tree runs prepare, tokenize, train (and, with --evaluate, evaluate) for one task in a scratch directory
of its own, its params.yaml the tree's own with the --set overrides applied to both; a local --source
replaces the task's fetch.source. Prints one JSON line: for each tree model.pt's md5, the train stage's
seconds, the training steps' median tokens a second, the best validation loss and the evaluate metrics;
"same_model" when model.pt is the same bytes. --rounds N runs each tree N times, in turn, and compares the
median tokens a second ("after_over_before").
Without --before, this tree alone runs (a param the other tree lacks, such as train.fast=false).
Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/throughput/same_results.py [--before /tmp/before] --task cumsum
        [--set train.epochs=1 ...]
        [--source ../shared/data/multi30k] [--evaluate] [--workdir /tmp/same_results] [--rounds 3]
"""

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lib.core.text import load_params, parse_yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lib", "stages", "transformer")
WARM_UP = 10  # training steps left out of the tokens a second (allocation, the first batches' shapes)


def overridden(params: dict, task: str, sets: list[str], source: str | None) -> dict:
    for item in sets:
        key, value = item.split("=", 1)
        *path, last = key.split(".")
        section = params[task]
        for part in path:
            section = section[part]
        section[last] = parse_yaml(value, f"--set {item}")
    if source:
        params[task]["fetch"]["source"] = str(Path(source).resolve())
    params["tasks"] = [task]
    return params


def run_tree(tree: Path, scratch: Path, task: str, args) -> dict:
    scratch.mkdir(parents=True)
    for package in PACKAGES:
        if (tree / package).is_dir():
            (scratch / package).symlink_to(tree / package)
    params = overridden(load_params(tree / "params.yaml"), task, args.set, args.source)
    (scratch / "params.yaml").write_text(json.dumps(params))  # JSON is YAML
    data, tok, model = f"data/{task}", f"models/{task}/tokenizer", f"models/{task}/model.pt"
    steps = [["fetch", task, "--out", f"sources/{task}"],
             ["prepare", task, "--source", f"sources/{task}", "--out", data],
             ["tokenize", task, "--data", data, "--out", tok],
             ["train", task, "--data", data, "--tokenizer", tok, "--model", model, "--checkpoints",
              f"models/{task}/checkpoints", "--live", f"reports/{task}/train"]]
    if args.evaluate:
        steps.append(["evaluate", task, "--data", data, "--tokenizer", tok, "--model", model, "--metrics",
                      f"reports/{task}/metrics.json", "--samples", f"reports/{task}/samples.jsonl", "--lengths",
                      f"reports/{task}/by_length.csv"])
        if '"generation"' in (tree / "stages" / "evaluate.py").read_text():  # a tree whose evaluate writes it
            steps[-1] += ["--generation", f"models/{task}/generation.json"]
    seconds = {}
    for stage, *argv in steps:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", f"stages.{stage}", *argv], cwd=scratch, capture_output=True,
                              text=True, env={"PYTHONPATH": str(scratch), "PATH": "/usr/bin:/bin"})
        if done.returncode:
            sys.exit(f"{tree}: {stage} failed:\n{done.stderr[-2000:]}")
        seconds[stage] = round(time.perf_counter() - start, 1)
    saved = torch.load(scratch / model, weights_only=True)
    metrics = scratch / f"reports/{task}/metrics.json"
    rate = scratch / f"reports/{task}/train/plots/metrics/train/tokens_per_s.tsv"
    rates = [float(line.split("\t")[-1]) for line in rate.read_text().splitlines()[1:]][WARM_UP:] \
        if rate.is_file() else []
    return {"tree": str(tree), "model_md5": hashlib.md5((scratch / model).read_bytes()).hexdigest(),
            "seconds": seconds, "valid_loss": saved["valid_loss"], "step": saved["step"],
            "tokens_per_s_median": round(statistics.median(rates)) if rates else None,
            "metrics": json.loads(metrics.read_text()) if metrics.is_file() else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the other checkout (git worktree add ...); left out, this "
                                                    "tree alone runs")
    parser.add_argument("--task", required=True)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="e.g. train.epochs=1")
    parser.add_argument("--source", default=None, help="a local copy for the task's fetch.source")
    parser.add_argument("--evaluate", action="store_true", help="also run the evaluate stage")
    parser.add_argument("--workdir", default=None, help="an existing folder to work in (default: the system's)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tree, taken in turn: the training "
                        "tokens a second are then their median")
    args = parser.parse_args()
    trees = {"before": args.before, "after": ROOT} if args.before else {"after": ROOT}
    rounds = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        for r in range(args.rounds):  # the trees in turn, the order reversed each round: drift slows both alike
            for name, tree in (list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]):
                rounds[name].append(run_tree(tree.resolve(), Path(scratch) / f"{name}{r}", args.task, args))
    runs = {name: {**done[0], **({"rounds_tokens_per_s": [run["tokens_per_s_median"] for run in done],
                                  "tokens_per_s_median": statistics.median(run["tokens_per_s_median"] for run in done)}
                                 if args.rounds > 1 else {})} for name, done in rounds.items()}
    same = {"same_model": runs["before"]["model_md5"] == runs["after"]["model_md5"]} if args.before else {}
    if args.before:
        rates = [runs[name]["tokens_per_s_median"] for name in ("after", "before")]
        same["after_over_before"] = round(rates[0] / rates[1], 3) if all(rates) else None
    print(json.dumps({"benchmark": "same_results", "task": args.task, "set": args.set, **runs, **same}))


if __name__ == "__main__":
    main()
