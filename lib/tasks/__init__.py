"""The tasks: each module says how its data is made or loaded and how it is scored.

A task module defines KIND ("seq2seq" or "lm"), a frozen ``PrepareConfig``,
``prepare(cfg, out_dir)`` writing its splits, ``tokenizer_texts(cfg,
data_dir, side)`` giving the training text a tokenizer learns from (side:
source, target or both), ``HEADLINE`` (the metrics reports/index.md shows),
and, for seq2seq tasks, ``score(hypotheses, references)`` and
``sentence_score`` returning its metrics. A seq2seq task may name one more
split to decode, ``EXTRA_SPLIT``, with ``split_metrics(frame, hypotheses,
test)`` scoring it (cumsum: its length study, set against the test split's
lengths) and ``EXTRA_SPLIT_LONGEST``, the param that sets its longest
sequence, and ``breakdown(sources, hypotheses, references)``, more scores of
the greedy test outputs (multi30k: BLEU by source length)."""

import importlib
from pathlib import Path

from lib.files import atomic_dir
from lib.config import ConfigError

TASKS = ("cumsum", "multi30k", "shakespeare")


def check_task_name(name: str):
    if name not in TASKS:
        raise ConfigError(f"tasks: unknown task {name!r} (known: {', '.join(TASKS)})")


def get_task(name: str):
    check_task_name(name)
    return importlib.import_module(f"lib.tasks.{name}")


def run_prepare(task: str, cfg, out_dir: str | Path):
    """Write the task's data into a fresh directory, replacing ``out_dir`` only when complete."""
    with atomic_dir(out_dir) as tmp:
        get_task(task).prepare(cfg, tmp)


def evaluated_splits(task: str) -> tuple[str, ...]:
    """The splits the evaluate stage decodes and scores: test, and the task's EXTRA_SPLIT (cumsum's length study)."""
    module = get_task(task)
    return ("test", *([module.EXTRA_SPLIT] if hasattr(module, "EXTRA_SPLIT") else []))
