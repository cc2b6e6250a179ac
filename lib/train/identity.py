"""What makes a saved checkpoint this run's to resume: the params that shape the model it trains, and a
fingerprint of its data, its tokenizer and the code that training runs."""

import ast
import hashlib
from dataclasses import asdict
from pathlib import Path

from lib.core.config import flatten

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lib", "transformer")  # the project's own packages, whose files a training run's code is

# Params that change how a run is logged, saved or computed (compiled kernels), not the model it trains:
# changing them continues a run.
RUN_KEYS = ("peak_tflops", "checkpoint_every", "compile")


def fingerprint(paths: list[Path]) -> str:
    """sha256 over the contents of files and directory trees, in a stable order."""
    digest = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
        for file in files:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def module_files(root: Path, name: str) -> list[Path]:
    """The source file of module ``name`` ("lib.data.pairs") under ``root``: a module's .py or a package's
    __init__.py."""
    module = root / Path(*name.split("."))
    return [f for f in (module.with_suffix(".py"), module / "__init__.py") if f.is_file()]


def training_code(task: str) -> list[Path]:
    """The files training runs: lib/train/training.py, what it imports at the top of the file (and the packages
    around each), and so on down, and the task's own module (loaded by name). A change to any other file (the
    report's plots, beam search) leaves a checkpoint resumable; dvc.yaml's train deps name the same files."""
    todo, found = [ROOT / "lib" / "train" / "training.py", ROOT / "lib" / "tasks" / f"{task}.py"], set()
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.add(path)
        for node in ast.parse(path.read_text()).body:  # top-level imports only: lazy ones sit in functions
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in (n for n in names if n.split(".")[0] in PACKAGES):
                parts = name.split(".")
                for end in range(1, len(parts) + 1):  # importing lib.train.run runs lib/train/__init__.py first
                    todo += module_files(ROOT, ".".join(parts[:end]))
    return sorted(found)


def run_identity(task: str, cfg, length_key: str, stop_keys: tuple[str, ...], schedule_uses_length: bool,
                 data_dir, tokenizer_dir) -> dict:
    """Every param but the length of training (unless the schedule depends on it), the stop rules and
    ``RUN_KEYS``; and the fingerprint of the inputs and of ``training_code``."""
    config = {k: v for k, v in asdict(cfg).items()
              if (k != length_key or schedule_uses_length) and k not in stop_keys and k not in RUN_KEYS}
    return {"config": config, "inputs": fingerprint([Path(data_dir), Path(tokenizer_dir), *training_code(task)])}


def mismatch(saved: dict, identity: dict, progress_key: str, length: int) -> str | None:
    """Why a saved checkpoint cannot be resumed, naming the first differing param; None if it can."""
    old = flatten(saved.get("config", {}))
    for key, value in flatten(identity["config"]).items():
        if old.get(key) != value:
            return f"train.{key} changed ({old.get(key)!r} -> {value!r})"
    if saved.get("inputs") != identity["inputs"]:
        return "the data, the tokenizer or the code changed"
    if saved[progress_key] > length:
        return f"it trained past the requested length ({saved[progress_key]} > {length})"
    return None
