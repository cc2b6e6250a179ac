"""A split's token ids written once and read by memory map: what a corpus of millions of pairs needs, where
holding its text, or its ids as Python lists, would cost gigabytes and minutes before the first step.

A split is five files in a directory: ``<split>.src.ids`` and ``<split>.tgt.ids``, each side's ids end to end
(int32, then one unused id); ``<split>.src.lengths`` and ``<split>.tgt.lengths``, each pair's length (int32);
and ``<split>.tokens.json``, the counts that say how long each file must be. ``MappedPairs`` reads them as
``lib.data.pairs.Pairs`` reads lists: the same batches, the same collate.
"""

import json
from collections.abc import Iterable
from functools import cached_property
from itertools import chain
from pathlib import Path

import numpy as np
import torch

from lib.data.pairs import Packed, Pairs
from lib.core.files import not_as_written

DTYPE = np.int32
SIDES = ("src", "tgt")


def side_paths(directory: str | Path, split: str, side: str) -> tuple[Path, Path]:
    return Path(directory) / f"{split}.{side}.ids", Path(directory) / f"{split}.{side}.lengths"


def meta_path(directory: str | Path, split: str) -> Path:
    return Path(directory) / f"{split}.tokens.json"


def write_pairs(chunks: Iterable[Pairs], directory: str | Path, split: str) -> dict:
    """Append each chunk of encoded pairs to ``split``'s files in ``directory`` (the caller writes the
    directory whole: ``lib.core.files.atomic_dir``); returns the counts, also written to its tokens.json."""
    counts = {"pairs": 0, "src_ids": 0, "tgt_ids": 0, "dtype": np.dtype(DTYPE).name}
    files = {side: [open(path, "wb") for path in side_paths(directory, split, side)] for side in SIDES}
    try:
        for chunk in chunks:
            for side in SIDES:
                seqs = getattr(chunk, side)
                ids_file, lengths_file = files[side]
                lengths = np.fromiter(map(len, seqs), dtype=DTYPE, count=len(seqs))
                ids = np.fromiter(chain.from_iterable(seqs), dtype=DTYPE, count=int(lengths.sum()))
                ids_file.write(ids.tobytes())
                lengths_file.write(lengths.tobytes())
                counts[f"{side}_ids"] += len(ids)
            counts["pairs"] += len(chunk)
        for side in SIDES:
            files[side][0].write(np.zeros(1, dtype=DTYPE).tobytes())  # the unused last id lib.data.pairs.Packed keeps
    finally:
        for opened in files.values():
            for file in opened:
                file.close()
    meta_path(directory, split).write_text(json.dumps(counts))
    return counts


class MappedPairs(Pairs):
    """``split``'s pairs from ``write_pairs``' files, memory-mapped: nothing is read until a batch asks."""

    def __init__(self, directory: str | Path, split: str):
        self.directory, self.split, self.rows = Path(directory), split, None
        meta = meta_path(directory, split)
        try:
            self.counts = json.loads(meta.read_text())
            n = self.counts["pairs"]
        except FileNotFoundError:
            raise FileNotFoundError(f"{meta}: not found (run the tokenize stage first)") from None
        except (ValueError, KeyError, TypeError) as err:
            raise not_as_written(meta, f"not the counts of a split ({err})", "tokenize") from None
        if self.counts.get("dtype") != np.dtype(DTYPE).name:
            raise not_as_written(meta, f"ids of {self.counts.get('dtype')}, where {np.dtype(DTYPE).name} are read",
                                 "tokenize")
        self.lengths = {side: self._mapped(side_paths(directory, split, side)[1], n) for side in SIDES}
        self.ids = {side: self._mapped(side_paths(directory, split, side)[0], self.counts[f"{side}_ids"] + 1)
                    for side in SIDES}
        for side in SIDES:
            if int(self.lengths[side].sum(dtype=np.int64)) != self.counts[f"{side}_ids"]:
                raise not_as_written(side_paths(directory, split, side)[1], "its lengths do not add up to the ids "
                                     "written", "tokenize")

    def _mapped(self, path: Path, count: int) -> np.ndarray:
        """The file as ``count`` int32s, mapped (copy on write: a tensor over it may be written, never the
        file); a file of any other size is named."""
        size = path.stat().st_size if path.is_file() else None
        expected = count * np.dtype(DTYPE).itemsize
        if size is None:
            raise FileNotFoundError(f"{path}: not found (run the tokenize stage first)")
        if size != expected:
            raise not_as_written(path, f"{size:,} bytes where its counts say {expected:,} (truncated, or from "
                                 "another run)", "tokenize")
        return np.memmap(path, dtype=DTYPE, mode="c", shape=(count,)) if count else np.zeros(0, dtype=DTYPE)

    def __len__(self):
        return self.counts["pairs"] if self.rows is None else len(self.rows)

    def subset(self, rows: list[int]) -> "MappedPairs":
        """The pairs ``rows`` only, mapped still (the ids are not copied)."""
        view = MappedPairs.__new__(MappedPairs)
        view.__dict__.update({key: value for key, value in self.__dict__.items() if key not in ("packed",)})
        view.rows = np.asarray(rows, dtype=np.int64) if self.rows is None else self.rows[rows]
        return view

    @cached_property
    def starts(self) -> dict[str, np.ndarray]:
        return {side: np.cumsum(self.lengths[side], dtype=np.int64) - self.lengths[side] for side in SIDES}

    def _of_rows(self, values: np.ndarray) -> np.ndarray:
        return values if self.rows is None else values[self.rows]

    @property
    def src(self) -> "Sequences":
        return Sequences(self, "src")

    @property
    def tgt(self) -> "Sequences":
        return Sequences(self, "tgt")

    def widths(self) -> list[int]:
        return np.maximum(self._of_rows(self.lengths["src"]), self._of_rows(self.lengths["tgt"]) + 1).tolist()

    @cached_property
    def packed(self) -> tuple[Packed, Packed]:
        return tuple(Packed(torch.from_numpy(self.ids[side]), torch.from_numpy(self._of_rows(self.starts[side])),
                            torch.from_numpy(self._of_rows(self.lengths[side]).astype(np.int64))) for side in SIDES)


class Sequences:
    """One side of ``MappedPairs`` as a sequence of id lists, each read when asked."""

    def __init__(self, pairs: MappedPairs, side: str):
        self.pairs, self.side = pairs, side

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i: int) -> list[int]:
        row = i if self.pairs.rows is None else int(self.pairs.rows[i])
        start, length = int(self.pairs.starts[self.side][row]), int(self.pairs.lengths[self.side][row])
        return self.pairs.ids[self.side][start:start + length].tolist()

    def __iter__(self):
        return (self[i] for i in range(len(self)))
