"""What makes a saved checkpoint this run's to resume: the params that shape the model it trains, and a
fingerprint of its data, its tokenizer and the code that training runs."""

import hashlib
from dataclasses import asdict
from pathlib import Path

from lib.core.config import flatten
from lib.core.imports import ROOT, closure

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


def training_code(task: str) -> list[Path]:
    """The files the train stage of ``task`` runs: stages/train.py and the task's own module (loaded by name), and
    all they import (lib.core.imports, the walk that writes dvc.yaml's train deps). A change to any other file
    (the report's plots, beam search) leaves a checkpoint resumable, as DVC leaves train up to date."""
    return closure([ROOT / "stages" / "train.py", ROOT / "lib" / "tasks" / f"{task}.py"])


def run_identity(task: str, cfg, length_key: str, stop_keys: tuple[str, ...], schedule_uses_length: bool,
                 data_dir, tokenizer_dir) -> dict:
    """Every param but the length of training (unless the schedule depends on it), the stop rules and
    ``RUN_KEYS``; and the fingerprint of the inputs and of ``training_code``."""
    config = {k: v for k, v in asdict(cfg).items()
              if (k != length_key or schedule_uses_length) and k not in stop_keys and k not in RUN_KEYS}
    start = [Path(cfg.init_from)] if cfg.init_from else []  # the weights it starts from, when not random
    return {"config": config, "inputs": fingerprint([Path(data_dir), Path(tokenizer_dir), *start,
                                                     *training_code(task)])}


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
