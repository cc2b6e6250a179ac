"""Parallel data: encoded pairs, length-bucketed token-budget batches, shift-right collate.

Dims: B sentences in a batch, S source length, T target length (+1 for bos/eos).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch

if TYPE_CHECKING:
    from lib.tokenizer import SpecialIds

SPLITS = ("train", "valid", "test")


def split_path(data_dir: str | Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.parquet"


def read_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    """A split of a parallel task: columns ``src`` and ``tgt``, one pair per row."""
    path = split_path(data_dir, split)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: split not found (run the prepare stage first)")
    return pd.read_parquet(path)


@dataclass
class Pairs:
    """A split encoded to token ids (no specials)."""

    src: list[list[int]]
    tgt: list[list[int]]

    def __len__(self):
        return len(self.src)


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) source ids, pad-filled
    tgt_in: torch.Tensor  # (B, T) bos + target: the decoder's input
    tgt_out: torch.Tensor  # (B, T) target + eos: what it must predict
    n_tokens: int  # non-pad targets

    def to(self, device) -> "Batch":
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.n_tokens)


def token_budget_batches(
    pairs: Pairs, max_tokens: int, generator: torch.Generator | None = None
) -> list[list[int]]:
    """Group similar lengths so that sentences x longest side <= max_tokens.

    With a generator, ties in length are broken at random and the batch order
    is shuffled; without one the order is fixed (for evaluation). A pair longer
    than the budget forms a batch of its own.
    """
    n = len(pairs)
    order = torch.randperm(n, generator=generator).tolist() if generator is not None else list(range(n))
    lengths = [max(len(pairs.src[i]), len(pairs.tgt[i]) + 1) for i in range(n)]
    order.sort(key=lambda i: lengths[i])  # stable: random ties stay random
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and (len(current) + 1) * longest_if_added > max_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    if generator is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def _pad(seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs], dtype=torch.long)


def collate(pairs: Pairs, indices: list[int], ids: "SpecialIds") -> Batch:
    """Shift right: the decoder reads bos + y and predicts y + eos."""
    src = _pad([pairs.src[i] for i in indices], ids.pad)  # (B, S)
    tgt_in = _pad([[ids.bos] + pairs.tgt[i] for i in indices], ids.pad)  # (B, T)
    tgt_out = _pad([pairs.tgt[i] + [ids.eos] for i in indices], ids.pad)  # (B, T)
    return Batch(src, tgt_in, tgt_out, int((tgt_out != ids.pad).sum()))


def text_path(data_dir: str | Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.txt"


def read_text(data_dir: str | Path, split: str) -> str:
    """A split of a language-modelling task: one plain UTF-8 text."""
    path = text_path(data_dir, split)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: split not found (run the prepare stage first)")
    return path.read_text(encoding="utf-8")
