"""The tasks: each module says how its data is made or loaded and how it is scored.

A task module defines KIND ("seq2seq" or "lm"), a frozen ``PrepareConfig``,
``prepare(cfg, out_dir)`` writing its splits, and ``score(hypotheses,
references)`` returning its metrics.
"""

import importlib
import shutil
from pathlib import Path

from lib.config import ConfigError

TASKS = ("cumsum", "shakespeare")


def get_task(name: str):
    if name not in TASKS:
        raise ConfigError(f"tasks: unknown task {name!r} (known: {', '.join(TASKS)})")
    return importlib.import_module(f"lib.tasks.{name}")


def run_prepare(task: str, cfg, out_dir: str | Path):
    """Write the task's data into a fresh directory, replacing ``out_dir`` only when complete."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        get_task(task).prepare(cfg, tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
