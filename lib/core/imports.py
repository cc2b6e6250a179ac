"""The project's own files that a module runs: its imports followed file by file, and the files it declares it
reads beside itself. One walk serves both the checkpoint's code fingerprint (lib.train.identity) and dvc.yaml's
deps (tools/deps.py), so the two cannot disagree."""

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lib", "stages", "transformer")  # the project's own packages; anything else is a library
# A module-level tuple of file names, relative to the module's folder, that the module reads when it runs
# (a page's style sheet): they are its code as much as its lines are.
DECLARATION = "DATA_FILES"


def module_files(root: Path, name: str) -> list[Path]:
    """The source file of module ``name`` ("lib.data.pairs") under ``root``: a module's .py or a package's
    __init__.py (none: a name imported from a module, not a module)."""
    module = root / Path(*name.split("."))
    return [f for f in (module.with_suffix(".py"), module / "__init__.py") if f.is_file()]


def imported(tree: ast.Module) -> list[str]:
    """Every module name an import in ``tree`` may load, those inside functions too (they run when their
    function does): ``from a.b import c`` may load a.b and a.b.c."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def declared_data(path: Path, tree: ast.Module) -> list[Path]:
    """The files the module at ``path`` reads beside itself: its ``DATA_FILES``, a tuple of string literals."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == DECLARATION for t in node.targets):
            files = [path.parent / name for name in ast.literal_eval(node.value)]
            if missing := [str(file) for file in files if not file.is_file()]:
                raise FileNotFoundError(f"{path}: {DECLARATION} names {', '.join(missing)}, which is not there")
            return files
    return []


@functools.lru_cache(maxsize=None)
def reads(path: Path, modified: int) -> tuple[tuple[str, ...], tuple[Path, ...]]:
    """The project's modules the file at ``path`` imports and the data files it declares, as it was at
    ``modified`` (a walk per stage and task reads each file once)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = tuple(n for n in imported(tree) if n.split(".")[0] in PACKAGES)
    return names, tuple(declared_data(path, tree))


def closure(starts: Iterable[Path], root: Path = ROOT) -> list[Path]:
    """The files under ``root`` that running ``starts`` (source files) runs: each one's imports of the project's
    packages, the packages around each (importing lib.train.run runs lib/__init__.py and lib/train/__init__.py
    first), and so on down; with the data files each declares. Sorted. A module loaded by a computed name (a
    task, by lib.tasks.get_task) is not seen: a caller adds it to ``starts``."""
    todo, found, files = [Path(start) for start in starts], set(), {}
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.add(path)
        if path.suffix != ".py":
            continue
        names, data = reads(path, path.stat().st_mtime_ns)
        todo += data
        for name in names:
            parts = name.split(".")
            for end in range(1, len(parts) + 1):
                module = ".".join(parts[:end])
                if module not in files:
                    files[module] = module_files(root, module)
                todo += files[module]
    return sorted(found)
