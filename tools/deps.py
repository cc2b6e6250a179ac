"""dvc.yaml's code deps, made from what each stage imports: run it after adding, moving or re-importing a module.

    python -m tools.deps            # write each stage's deps on the project's code into dvc.yaml
    python -m tools.deps --check    # say which stage lists a file it does not run, or misses one it does

A stage's code is its script (``python -m stages.<name>`` in its cmd) and every file of lib/, stages/ and
transformer/ it imports, file by file (lib.core.imports: the walk the checkpoint's fingerprint uses too). A stage
run for each task (foreach) lists ``lib/tasks/${item}.py``, its own task's module, and what any task's module
imports; so a new task that imports only what others import changes no other task's stage. The index stage
runs every listed task's module: it lists them all. Deps that are not code (data, models) stay as written.
"""

import argparse
import re
import sys
from pathlib import Path

from ruamel.yaml import YAML

from lib.core.imports import PACKAGES, ROOT, closure
from lib.tasks import task_names

ITEM_TASK = "lib/tasks/${item}.py"  # a foreach stage's own task module


def is_code(dep: str) -> bool:
    return dep.split("/")[0] in PACKAGES


def stage_script(cmd: str, root: Path) -> Path:
    """The file of the module a stage's cmd runs (``python -m stages.train ...``)."""
    match = re.search(r"python -m (stages\.\w+)", " ".join(cmd.split()))
    if not match:
        raise ValueError(f"{cmd!r}: not `python -m stages.<name> ...`, so its code cannot be found")
    return root / Path(*match.group(1).split(".")).with_suffix(".py")


def code_deps(script: Path, per_task: bool, root: Path = ROOT) -> list[str]:
    """The code deps of the stage that runs ``script``: for each task (``per_task``) with its own module as
    ``ITEM_TASK``, else with every task's module."""
    tasks = [root / "lib" / "tasks" / f"{name}.py" for name in task_names()]
    if not per_task:
        return [relative(path, root) for path in closure([script, *tasks], root)]
    found = set()
    for task in tasks:
        found |= set(closure([script, task], root)) - {task}
    return sorted(relative(path, root) for path in found) + [ITEM_TASK]


def relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def read(dvc_yaml: Path):
    yaml = YAML()  # round trip: comments, order and the rest of the file kept
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml, yaml.load(dvc_yaml.read_text())


def drift(dvc_yaml: Path = ROOT / "dvc.yaml", write: bool = False) -> dict[str, tuple[list[str], list[str]]]:
    """Per stage whose code deps differ from what it runs: (the files it runs but does not list, the listed
    code it does not run). ``write``: set every stage's code deps to what it runs, after its other deps."""
    root = dvc_yaml.parent
    yaml, document = read(dvc_yaml)
    differences, rewritten = {}, False
    for name, stage in document["stages"].items():
        body = stage["do"] if "foreach" in stage else stage
        listed = [str(dep) for dep in body.get("deps", [])]
        wanted = code_deps(stage_script(body["cmd"], root), "foreach" in stage, root)
        present = [dep for dep in listed if is_code(dep)]
        if set(present) != set(wanted):
            differences[name] = (sorted(set(wanted) - set(present)), sorted(set(present) - set(wanted)))
        if write and present != wanted:
            deps = body["deps"]
            for index in reversed(range(len(deps))):
                if is_code(str(deps[index])):
                    del deps[index]
            deps.extend(wanted)
            rewritten = True
    if rewritten:
        with dvc_yaml.open("w") as file:
            yaml.dump(document, file)
    return differences


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.deps", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any stage's deps differ")
    parser.add_argument("--dvc-yaml", type=Path, default=ROOT / "dvc.yaml", help="default: the project's")
    args = parser.parse_args(argv)
    differences = drift(args.dvc_yaml, write=not args.check)
    for stage, (missing, extra) in differences.items():
        for dep in missing:
            print(f"{stage}: runs {dep}, which its deps do not list")
        for dep in extra:
            print(f"{stage}: lists {dep}, which it does not run")
    if args.check and differences:
        sys.exit(f"{args.dvc_yaml}: {len(differences)} stage(s) out of date; run `python -m tools.deps` to write them")
    if not args.check:
        print(f"{args.dvc_yaml}: " + (f"{len(differences)} stage(s) rewritten" if differences else "up to date"))


if __name__ == "__main__":
    main()
