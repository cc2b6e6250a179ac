"""Parallel data: encoded pairs, length-bucketed token-budget batches, shift-right collate.

Dims: B sentences in a batch, S source length, T target length (+1 for bos/eos).
"""

from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch

from lib.core.files import not_as_written
from transformer.config import SpecialIds


def split_path(data_dir: str | Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.parquet"


def read_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    """A split of a parallel task: columns ``src`` and ``tgt`` of texts, one pair per row, at least one row."""
    path = split_path(data_dir, split)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: split not found (run the prepare stage first)")
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as err:  # pyarrow's errors name a buffer, not the file
        raise not_as_written(path, f"not a readable split ({type(err).__name__})", "prepare") from None
    if not {"src", "tgt"} <= set(frame.columns):
        raise not_as_written(path, f"expected columns src and tgt, found {list(frame.columns)}", "prepare")
    if frame.empty:  # each split is trained on, validated against or scored: none may be empty
        raise not_as_written(path, "no pairs", "prepare")
    for column in ("src", "tgt"):  # what the tokenizer takes: text, where a missing value or a number stops it
        texts = frame[column].map(lambda value: isinstance(value, str))
        if not texts.all():
            row = int(texts.to_numpy().argmin())
            value = frame[column].iloc[row]
            missing = pd.api.types.is_scalar(value) and pd.isna(value)  # None, or NaN: pandas reads both
            found = "missing" if missing else f"{value} of type {type(value).__name__}, not a text"
            raise not_as_written(path, f"row {row} (from 0): {column} is {found}", "prepare")
    return frame


class Packed(NamedTuple):
    """Sequences end to end in one tensor: sequence i is ids[starts[i]:starts[i] + lengths[i]]."""

    ids: torch.Tensor  # (total + 1,): a last unused id, so that it is never empty
    starts: torch.Tensor  # (N,)
    lengths: torch.Tensor  # (N,)


def pack(seqs: list[list[int]]) -> Packed:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    flat = torch.tensor(list(chain.from_iterable(seqs)) + [0], dtype=torch.long)
    return Packed(flat, lengths.cumsum(0) - lengths, lengths)


@dataclass
class Pairs:
    """A split encoded to token ids (no specials)."""

    src: list[list[int]]
    tgt: list[list[int]]

    def __len__(self):
        return len(self.src)

    def subset(self, rows: list[int]) -> "Pairs":
        return Pairs([self.src[i] for i in rows], [self.tgt[i] for i in rows])

    def widths(self) -> list[int]:
        """Each pair's wider side, as a batch pads it: the source, or the target with its bos (or eos)."""
        return [max(len(s), len(t) + 1) for s, t in zip(self.src, self.tgt)]

    def side_lengths(self, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The sources' lengths and the targets' with their eos (N,) each, of ``rows`` (default: all); read from
        the packed lengths, with no Python work per pair."""
        src, tgt = (packed.lengths if rows is None else packed.lengths[rows] for packed in self.packed)
        return src, tgt + 1

    @cached_property
    def packed(self) -> tuple[Packed, Packed]:
        """The source and target sequences packed, made once: a batch is then a few tensor
        gathers, where padding each list in Python would keep a GPU idle between steps."""
        return pack(self.src), pack(self.tgt)


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) source ids, pad-filled
    tgt_in: torch.Tensor  # (B, T) bos + target: the decoder's input
    tgt_out: torch.Tensor  # (B, T) target + eos: what it must predict
    n_tokens: int  # non-pad targets

    def to(self, device) -> "Batch":
        return Batch(to_device(self.src, device), to_device(self.tgt_in, device), to_device(self.tgt_out, device),
                     self.n_tokens)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor.to(device)``; to a GPU, queued from pinned memory so that the host does not wait.

    A copy from ordinary (pageable) memory makes the host wait until the GPU has
    finished all the work queued before it; the kernels that read the copy are
    queued after it on the same stream, so they see the data.
    """
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def token_budget_batches(
    pairs: Pairs, max_tokens: int, generator: torch.Generator | None = None, unit: str = "padded"
) -> list[list[int]]:
    """Group similar lengths so that a batch holds at most ``max_tokens`` tokens a side: with ``unit`` padded,
    sentences x the longest padded side; with real, the non-pad tokens of each side (the paper's count, sec.
    5.1: "approximately 25000 source tokens and 25000 target tokens"), targets with their eos.

    With a generator, ties in length are broken at random and the batch order
    is shuffled; without one the order is fixed (for evaluation). A pair longer
    than the budget forms a batch of its own.
    """
    n = len(pairs)
    order = torch.randperm(n, generator=generator).tolist() if generator is not None else list(range(n))
    lengths = pairs.widths()
    order.sort(key=lambda i: lengths[i])  # stable: random ties stay random
    src, tgt = (side.tolist() for side in pairs.side_lengths()) if unit == "real" else ([0] * n, [0] * n)
    batches, current, longest, src_sum, tgt_sum = [], [], 0, 0, 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if unit == "real":
            over = max(src_sum + src[i], tgt_sum + tgt[i]) > max_tokens
        else:
            over = (len(current) + 1) * longest_if_added > max_tokens
        if current and over:
            batches.append(current)
            current, longest_if_added, src_sum, tgt_sum = [], lengths[i], 0, 0
        current.append(i)
        longest, src_sum, tgt_sum = longest_if_added, src_sum + src[i], tgt_sum + tgt[i]
    if current:
        batches.append(current)
    if generator is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def _gather(packed: Packed, rows: torch.Tensor, pad_id: int, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences ``rows`` left-aligned in a pad-filled (B, longest + extra) tensor, and their lengths (B,)."""
    lengths = packed.lengths[rows]  # (B,)
    cols = torch.arange(int(lengths.max()) + extra)  # (W,)
    empty = cols >= lengths[:, None]  # (B, W) the places after each sequence
    index = (packed.starts[rows, None] + cols).masked_fill_(empty, 0)  # (B, W) into packed.ids
    return packed.ids[index].long().masked_fill_(empty, pad_id), lengths  # ids stored narrower (token_store) widened


def collate(pairs: Pairs, indices: list[int], ids: SpecialIds) -> Batch:
    """Shift right: the decoder reads bos + y and predicts y + eos."""
    rows = torch.tensor(indices, dtype=torch.long)
    src, _ = _gather(pairs.packed[0], rows, ids.pad)  # (B, S)
    tgt, lengths = _gather(pairs.packed[1], rows, ids.pad, extra=1)  # (B, T): y, and a pad column after the longest
    tgt_in = torch.cat([torch.full((len(indices), 1), ids.bos), tgt[:, :-1]], dim=1)  # (B, T)
    tgt_out = tgt.index_put_((torch.arange(len(indices)), lengths), torch.tensor(ids.eos))  # (B, T)
    return Batch(src, tgt_in, tgt_out, int(lengths.sum()) + len(indices))


def text_path(data_dir: str | Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.txt"


def read_text(data_dir: str | Path, split: str) -> str:
    """A split of a language-modelling task: one plain UTF-8 text."""
    path = text_path(data_dir, split)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: split not found (run the prepare stage first)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise not_as_written(path, f"not UTF-8 text at byte {err.start}", "prepare") from None
