"""The length checks before training: every sequence must fit the model's positions (model.max_len), and a
batch's token budget should hold more than one sentence."""

import logging

from lib.core.config import ConfigError
from lib.data.pairs import Pairs
from lib.tasks import get_task

log = logging.getLogger(__name__)


def fit_lengths(pairs: Pairs, max_len: int, split: str, too_long: str) -> tuple[Pairs, int]:
    """Every sequence (with its bos or eos) must fit the positional encoding: fail, or skip the pairs that do not.
    Returns the pairs kept and how many were skipped."""
    widths = pairs.widths()  # the positions each pair takes: its source, or its target with its bos or eos
    fits = [width <= max_len for width in widths]
    if all(fits):
        return pairs, 0
    if too_long == "fail":
        raise ConfigError(f"train.model.max_len: {max_len} is shorter than the longest {split} sequence "
                          f"({max(widths)} tokens); raise it, or set train.too_long: skip")
    kept = [i for i, ok in enumerate(fits) if ok]
    log.warning("%s: skipped %d of %d pairs longer than train.model.max_len %d (train.too_long: skip)", split,
                len(pairs) - len(kept), len(pairs), max_len)
    if not kept:
        raise ConfigError(f"train.model.max_len: {max_len} is shorter than every {split} pair")
    return pairs.subset(kept), len(pairs) - len(kept)


def check_evaluated_lengths(task: str, splits: dict[str, Pairs], max_len: int):
    """``splits`` (the ones evaluate decodes, encoded) must fit ``max_len`` whatever train.too_long says, for
    evaluate has no pair it may drop: a ConfigError naming the longest, before training rather than after it.
    A task whose ``long_test`` is "cut" decodes a long test source from its first max_len tokens instead."""
    for split, pairs in splits.items():
        if split == "test" and get_task(task).long_test == "cut":
            continue
        if (longest := max(pairs.widths())) > max_len:
            sets = get_task(task).extra_split_longest if split != "test" else None
            raise ConfigError(f"train.model.max_len: {max_len} is shorter than the longest {split} sequence ({longest} "
                              "tokens), which the evaluate stage decodes and scores; raise it"
                              + (f", or lower {task}.{sets}" if sets else "")
                              + " (train.too_long: skip drops training pairs only)")


def check_budget(pairs: Pairs, max_tokens: int):
    """Warn when pairs are wider than the token budget: each of them is a batch of its own (token_budget_batches),
    one sentence a batch, and a budget meant in sentences (max_tokens: 8) makes every batch that."""
    over = [width for width in pairs.widths() if width > max_tokens]
    if over:
        log.warning("train.max_tokens %d: %s of %s train pairs are wider (up to %d tokens a side), and each of them "
                    "is a batch of one sentence; raise it to batch them", max_tokens, f"{len(over):,}",
                    f"{len(pairs):,}", max(over))
