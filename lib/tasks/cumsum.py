"""Cumulative sums: digits in, running sums out (the source article's toy task).

"3 1 4 1" -> "3 4 8 9". Every output token depends on one input token and the
previous output, so a working encoder-decoder learns it in minutes, and a
broken mask or position encoding shows at once.

With ``modulus`` 10 the outputs are the sums' last digits ("9 9 9" ->
"9 8 7"), so every output token occurs at every length. Plain sums grow with
the length: 21% of 16-digit sequences reach a sum of 80, which 10 of the
40,000 training sequences of 4-12 digits do. A longer sequence then asks for
arithmetic on tokens training barely saw, as well as for unseen positions;
with a modulus the length study measures the positions alone.
"""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from lib.core.config import ConfigError, check_seed, require
from lib.core.files import check_readable
from lib.data.pairs import read_split
from lib.tasks.base import SPLIT_FILES, Task, exact_matches



@dataclass(frozen=True)
class PrepareConfig:
    seed: int  # the generator's seed: same seed, same data
    min_length: int  # shortest sequence (digits)
    max_length: int  # longest sequence (digits)
    n_train: int  # training pairs
    n_valid: int  # validation pairs, none of them in train
    n_test: int  # test pairs, none of them in train or valid
    vocab_length: int  # the vocabulary holds every running sum of sequences this long
    n_per_length: int  # length study: sequences of each length 1..vocab_length, none of them in train
    modulus: int = 0  # 0: plain running sums; m > 1: each sum modulo m (the vocabulary: 0..m-1)

    def __post_init__(self):
        check_seed(self.seed)
        require(self.min_length >= 1, "min_length", "must be >= 1")
        require(self.max_length >= self.min_length, "max_length", "must be >= min_length")
        for name in ("n_train", "n_valid", "n_test"):
            require(getattr(self, name) > 0, name, "must be > 0")
        require(self.vocab_length >= self.max_length, "vocab_length", "must be >= max_length")
        require(self.n_per_length > 0, "n_per_length", "must be > 0")
        require(self.modulus == 0 or self.modulus > 1, "modulus", "must be 0 (plain sums) or > 1")
        distinct = sum(10**n for n in range(self.min_length, self.max_length + 1))
        require(
            self.n_valid + self.n_test < distinct,
            "n_test",
            f"valid + test need more distinct sequences than lengths {self.min_length}-{self.max_length} allow",
        )


def running_sums(digits: list[int], modulus: int = 0) -> list[int]:
    total, out = 0, []
    for d in digits:
        total += d
        out.append(total % modulus if modulus else total)
    return out


def _pair(digits: list[int], modulus: int) -> tuple[str, str]:
    return " ".join(map(str, digits)), " ".join(map(str, running_sums(digits, modulus)))


def _draw(generator: torch.Generator, cfg: PrepareConfig) -> tuple[int, ...]:
    length = int(torch.randint(cfg.min_length, cfg.max_length + 1, (1,), generator=generator))
    return tuple(torch.randint(0, 10, (length,), generator=generator).tolist())


def length_study(cfg: PrepareConfig, train: set, generator: torch.Generator) -> list[tuple[int, ...]]:
    """n_per_length sequences of every length 1..vocab_length, outside train.

    Short lengths have fewer distinct sequences (10 of length 1): they get all
    that exist outside train, when that is fewer than n_per_length.
    """
    rows = []
    for length in range(1, cfg.vocab_length + 1):
        available = 10**length - sum(len(t) == length for t in train)
        wanted = min(cfg.n_per_length, available)
        chosen: dict[tuple[int, ...], None] = {}
        while len(chosen) < wanted:
            digits = tuple(torch.randint(0, 10, (length,), generator=generator).tolist())
            if digits not in train:
                chosen[digits] = None
        rows += list(chosen)
    return rows


class Cumsum(Task):
    """Cumulative sums: running sums of digit sequences, and a length study of longer ones."""
    name = "cumsum"
    PrepareConfig = PrepareConfig
    scores = ("exact_match", "token_accuracy")
    headline = ("greedy.exact_match", "greedy.token_accuracy", "exact_up_to_length")
    valid_metric = "exact_match"
    extra_split = "lengths"  # the length study: evaluate decodes it too, and scores it by length
    extra_split_longest = "prepare.vocab_length"  # its longest sequence, in digits
    numeric_targets = True
    prepared = (*SPLIT_FILES, "lengths.parquet", "alphabet.txt")

    def prepare(self, cfg: PrepareConfig, out_dir: Path, source_dir: Path | None = None):
        """Write train/valid/test/lengths parquet files (columns src, tgt) and alphabet.txt (``source_dir``,
        where fetch put a task's files, holds nothing for this one).

        Held-out sequences are drawn first and distinct; training sequences are
        drawn until n_train of them avoid every held-out one.
        """
        generator = torch.Generator().manual_seed(cfg.seed)
        held_out: dict[tuple[int, ...], None] = {}  # insertion-ordered set
        while len(held_out) < cfg.n_valid + cfg.n_test:
            held_out[_draw(generator, cfg)] = None
        held = list(held_out)
        train = []
        while len(train) < cfg.n_train:
            digits = _draw(generator, cfg)
            if digits not in held_out:
                train.append(digits)
        splits = {"train": train, "valid": held[: cfg.n_valid], "test": held[cfg.n_valid :]}
        # Drawn after the three splits, so that adding it left them unchanged.
        splits["lengths"] = length_study(cfg, set(train), generator)
        for split, rows in splits.items():
            frame = pd.DataFrame([_pair(list(d), cfg.modulus) for d in rows], columns=["src", "tgt"])
            frame.to_parquet(out_dir / f"{split}.parquet", index=False)
        # Every sum that a sequence of vocab_length digits can reach, so that
        # longer test sequences never meet an unknown token.
        alphabet = " ".join(str(n) for n in range(cfg.modulus or 9 * cfg.vocab_length + 1))
        (out_dir / "alphabet.txt").write_text(alphabet + "\n")

    def tokenizer_texts(self, cfg, data_dir: Path, side: str) -> list[str]:
        """Training sources and/or targets, plus one line of every sum the task can produce, so that sums
        larger than any training sequence reaches still enter the vocabulary.

        That vocabulary is closed (every digit and sum, each seen at least once), so a min_frequency
        above 1 could only drop sums the model must be able to write: it is refused.
        """
        if cfg.min_frequency != 1:
            raise ConfigError(f"cumsum.tokenize.min_frequency: {cfg.min_frequency}, but cumsum's vocabulary is closed "
                              "(every digit and every sum the task can produce): it must be 1")
        train = read_split(data_dir, "train")
        alphabet_path = Path(data_dir) / "alphabet.txt"
        check_readable(alphabet_path, writer="prepare")
        alphabet = alphabet_path.read_text().strip()
        sources = train["src"].tolist() if side in ("source", "both") else []
        targets = train["tgt"].tolist() + [alphabet] if side in ("target", "both") else []
        return sources + targets

    def score(self, hypotheses: list[str], references: list[str]) -> dict:
        """Exact-sequence match and per-position token accuracy over the references."""
        exact = sum(exact_matches(hypotheses, references))
        correct = total = 0
        for h, r in zip(hypotheses, references):
            h_tokens, r_tokens = h.split(), r.split()
            correct += sum(a == b for a, b in zip(h_tokens, r_tokens))
            total += len(r_tokens)
        return {"exact_match": exact / len(references), "token_accuracy": correct / total}

    def sentence_score(self, hypothesis: str, reference: str) -> float:
        """The share of the reference's positions whose token the output matches."""
        tokens = reference.split()
        return sum(a == b for a, b in zip(hypothesis.split(), tokens)) / len(tokens)
