"""A task as one class: the base gives every method and attribute a default, and a task overrides
what differs. The pipeline asks a task for its data, its vocabulary's text and its scores, and reads what
it declares (its kind, its headline metrics, the files it writes); it never probes for an attribute.

A task ``<name>`` is the subclass of ``Task`` in ``lib/tasks/<name>.py`` whose ``name`` is ``<name>``, with a
``<name>:`` section in params.yaml: docs/adding-a-task.md walks through one.
"""

import sys
from collections.abc import Iterable
from pathlib import Path

from lib.data.pairs import read_split, read_text
from lib.data.sources import NothingToFetch

SPLIT_FILES = ("train.parquet", "valid.parquet", "test.parquet")


class Task:
    """A sequence-to-sequence task by default: parquet splits of (src, tgt) text, scored by exact match."""

    name: str = ""  # the params section, the module (lib/tasks/<name>.py) and every output folder's name
    kind: str = "seq2seq"  # "seq2seq" (the encoder-decoder) or "lm" (the decoder-only model)
    FetchConfig: type = NothingToFetch  # the frozen dataclass of the fetch section (none: prepare makes the data)
    PrepareConfig: type = NothingToFetch  # the frozen dataclass of the prepare section (every task sets its own)
    headline: tuple[str, ...] = ("greedy.exact_match",)  # the metrics its card in reports/index.html shows
    valid_score: str | None = "exact_match"  # the key of score() training logs after each epoch (None: loss only)
    sentence_score: str = "exact"  # each output's own score, to find the worst (lib.evaluate.sentence_scores)
    extra_split: str | None = None  # a split evaluate decodes too, scored by exact match at each source length
    extra_split_longest: str | None = None  # the param that sets the extra split's longest sequence
    numeric_targets: bool = False  # the targets are numbers: the report shows accuracy by target value
    # A test sentence longer than model.max_len: "fail" (train stops before it starts, naming the param), or
    # "cut" (decoded from its first max_len tokens and scored whole against its reference; the report counts them)
    long_test: str = "fail"
    token_store: bool = False  # tokenize writes the splits' ids once, and train maps them (a corpus of millions)
    fetched: tuple[str, ...] = ()  # fnmatch patterns of the files fetch writes beside manifest.json
    prepared: tuple[str, ...] = SPLIT_FILES  # fnmatch patterns of the files prepare writes

    @property
    def description(self) -> str:
        """The first line of the task module's docstring: what the index page says of it."""
        return (sys.modules[type(self).__module__].__doc__ or self.name).strip().splitlines()[0]

    @property
    def evaluated_splits(self) -> tuple[str, ...]:
        """The splits the evaluate stage decodes and scores: test, and the extra split if there is one."""
        return ("test", *([self.extra_split] if self.extra_split else []))

    def fetch(self, cfg, out_dir: Path) -> list[str]:
        """Download or copy the task's source files into ``out_dir``; return their names (none by default)."""
        return []

    def prepare(self, cfg, out_dir: Path, source_dir: Path | None):
        """Write the splits (``prepared``) into ``out_dir`` from what fetch put in ``source_dir``."""
        raise NotImplementedError(f"task {self.name}: prepare writes its splits")

    def tokenizer_texts(self, cfg, data_dir: Path, side: str) -> Iterable[str]:
        """The training text the tokenizer learns from: the train split's sources, targets or both (``side``)."""
        train = read_split(data_dir, "train")
        columns = {"source": ["src"], "target": ["tgt"], "both": ["src", "tgt"]}[side]
        return [text for column in columns for text in train[column].tolist()]

    def score(self, hypotheses: list[str], references: list[str]) -> dict:
        """The corpus metrics of outputs against references: exact-sequence match by default."""
        return {"exact_match": sum(h == r for h, r in zip(hypotheses, references)) / len(references)}


class LMTask(Task):
    """A decoder-only language model's task: one text per split (train.txt, valid.txt), scored by its loss."""

    kind = "lm"
    headline = ("loss", "bits_per_char")
    valid_score = None
    prepared = ("train.txt", "valid.txt")

    def tokenizer_texts(self, cfg, data_dir: Path, side: str) -> Iterable[str]:
        """The training text (a language model has one side)."""
        return [read_text(data_dir, "train")]
