"""The tasks: each module says how its data is made or loaded and how it is scored.

A task module defines KIND ("seq2seq" or "lm"); where its data comes from
elsewhere, a frozen ``FetchConfig`` and ``fetch(cfg, out_dir)`` putting the
source files there and returning their names (lib.data.sources); a frozen
``PrepareConfig`` and ``prepare(cfg, out_dir, source_dir)`` writing its splits, ``tokenizer_texts(cfg,
data_dir, side)`` giving the training text a tokenizer learns from (side:
source, target or both), ``HEADLINE`` (the metrics its card in reports/index.html
shows), and, for seq2seq tasks, ``score(hypotheses, references)`` and
``sentence_score`` returning its metrics, and ``VALID_SCORE``, the one of them
training logs after each epoch. Every task's evaluate stage also
writes a score by length (by_length.csv: a ``length`` column, the score last).
A seq2seq task gives it either by naming one more split to decode,
``EXTRA_SPLIT``, with ``split_metrics(frame, hypotheses, test)`` returning its
metrics and that table (cumsum: its length study, set against the test split's
lengths) and ``EXTRA_SPLIT_LONGEST``, the param that sets its longest
sequence; or by ``breakdown(sources, hypotheses, references)``, the table of
the greedy test outputs (multi30k: BLEU by source length)."""

import importlib

from lib.core.config import ConfigError
from lib.tasks import translation  # noqa: F401 (the translation tasks' scores, loaded with every task alike)

TASKS = ("cumsum", "multi30k", "shakespeare", "wmt14")


def check_task_name(name: str):
    if name not in TASKS:
        raise ConfigError(f"tasks: unknown task {name!r} (known: {', '.join(TASKS)})")


def get_task(name: str):
    check_task_name(name)
    return importlib.import_module(f"lib.tasks.{name}")


def evaluated_splits(task: str) -> tuple[str, ...]:
    """The splits the evaluate stage decodes and scores: test, and the task's EXTRA_SPLIT (cumsum's length study)."""
    module = get_task(task)
    return ("test", *([module.EXTRA_SPLIT] if hasattr(module, "EXTRA_SPLIT") else []))
