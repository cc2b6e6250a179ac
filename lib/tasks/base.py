"""A task as one class: the base gives every method and attribute a default, and a task overrides
what differs. The pipeline asks a task for its data, its vocabulary's text and its scores, and reads what
it declares (its family, its headline metrics, the files it writes); it never probes for an attribute.

A task ``<name>`` is the subclass of ``Task`` in ``lib/tasks/<name>.py`` whose ``name`` is ``<name>``, with a
``<name>:`` section in params.yaml: docs/adding-a-task.md walks through one.
"""

import sys
from collections.abc import Iterable
from fnmatch import fnmatchcase
from pathlib import Path

from lib.core.config import ConfigError
from lib.data.pairs import read_split, read_text
from lib.data.sources import NothingToFetch

SPLIT_FILES = ("train.parquet", "valid.parquet", "test.parquet")
# The metrics.json keys the evaluate stage writes for a task of each family, beside a seq2seq task's scores by
# search (greedy.<score>, beam<width>.<score>); tests/test_stages.py holds the stage to them.
SEQ2SEQ_METRICS = ("n_test", "loss", "perplexity", "valid_loss", "valid_perplexity", "parameters")
SEARCHES = ("greedy", "beam*")
EXTRA_SPLIT_METRICS = ("exact_up_to_length",)  # the extra split's, scored by length
LM_METRICS = ("n_valid_tokens", "loss", "perplexity", "bits_per_char", "parameters")


def exact_matches(hypotheses: list[str], references: list[str]) -> list[bool]:
    """For each output, whether it is its reference exactly: exact match, the score every task can give."""
    return [h == r for h, r in zip(hypotheses, references)]


class Task:
    """A sequence-to-sequence task by default: parquet splits of (src, tgt) text, scored by exact match."""

    name: str = ""  # the params section, the module (lib/tasks/<name>.py) and every output folder's name
    family: str = "seq2seq"  # the model family (lib.core.families): the encoder-decoder; LMTask's is "lm"
    FetchConfig: type = NothingToFetch  # the frozen dataclass of the fetch section (none: prepare makes the data)
    PrepareConfig: type = NothingToFetch  # the frozen dataclass of the prepare section (every task sets its own)
    scores: tuple[str, ...] = ("exact_match",)  # the keys of the numbers score() returns
    # The metrics its card in reports/index.html shows: patterns of metric_names() (``*``: any beam width)
    headline: tuple[str, ...] = ("greedy.exact_match",)
    valid_metric: str | None = "exact_match"  # the one of ``scores`` training logs after each epoch (None: loss only)
    extra_split: str | None = None  # a split evaluate decodes too, scored by exact match at each source length
    extra_split_longest: str | None = None  # the param that sets the extra split's longest sequence
    numeric_targets: bool = False  # the targets are numbers: the report shows accuracy by target value
    # A test sentence longer than model.max_len: "fail" (train stops before it starts, naming the param), or
    # "cut" (decoded from its first max_len tokens and scored whole against its reference; the report counts them)
    long_test: str = "fail"
    token_store: bool = False  # tokenize writes the splits' ids once, and train maps them (a corpus of millions)
    fetched: tuple[str, ...] = ()  # fnmatch patterns of the files fetch writes beside manifest.json
    prepared: tuple[str, ...] = SPLIT_FILES  # fnmatch patterns of the files prepare writes

    def __init_subclass__(cls, **kwargs):
        """A task's declarations checked as its class is defined, each failure naming the task and the hook: its
        name against its file, its validation metric among its scores, each headline pattern against the
        metrics the evaluate stage writes for it."""
        super().__init_subclass__(**kwargs)
        where = f"{cls.__module__}.{cls.__qualname__}"
        module = cls.__module__.rpartition(".")[2]
        if cls.__module__.startswith("lib.tasks.") and cls.name and cls.name != module:
            raise ConfigError(f"{where}: name {cls.name!r} differs from its file lib/tasks/{module}.py; a task is "
                              f"found by its file's name (rename one to match the other)")
        if cls.valid_metric is not None and cls.valid_metric not in cls.scores:
            raise ConfigError(f"{where}: valid_metric {cls.valid_metric!r} is not among its scores "
                              f"({', '.join(cls.scores)})")
        names = cls.metric_names()
        if unmatched := [pattern for pattern in cls.headline if not any(fnmatchcase(n, pattern) for n in names)]:
            raise ConfigError(f"{where}: headline {', '.join(map(repr, unmatched))} matches none of the metrics "
                              f"its evaluate stage writes ({', '.join(names)})")

    @classmethod
    def metric_names(cls) -> tuple[str, ...]:
        """The keys (dotted) of what the evaluate stage writes to metrics.json for this task."""
        searched = tuple(f"{search}.{score}" for search in SEARCHES for score in cls.scores)
        return SEQ2SEQ_METRICS + searched + (EXTRA_SPLIT_METRICS if cls.extra_split else ())

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

    def one_vocabulary(self, cfg) -> bool:
        """Whether tokenize learns one vocabulary for both sides (``cfg``: the tokenize section), or one a side."""
        return cfg.joint

    def tokenizer_texts(self, cfg, data_dir: Path, side: str) -> Iterable[str]:
        """The training text the tokenizer learns from: the train split's sources, targets or both (``side``)."""
        train = read_split(data_dir, "train")
        columns = {"source": ["src"], "target": ["tgt"], "both": ["src", "tgt"]}[side]
        return [text for column in columns for text in train[column].tolist()]

    def score(self, hypotheses: list[str], references: list[str]) -> dict:
        """The corpus metrics of outputs against references (``scores``): exact-sequence match by default."""
        return {"exact_match": sum(exact_matches(hypotheses, references)) / len(references)}

    def sentence_score(self, hypothesis: str, reference: str) -> float:
        """One output's own score, by which the report picks the worst: 1 where it is the reference, else 0."""
        return float(hypothesis == reference)


class LMTask(Task):
    """A decoder-only language model's task: one text per split (train.txt, valid.txt), scored by its loss."""

    family = "lm"
    scores = ()
    headline = ("loss", "bits_per_char")
    valid_metric = None
    prepared = ("train.txt", "valid.txt")

    @classmethod
    def metric_names(cls) -> tuple[str, ...]:
        return LM_METRICS

    def one_vocabulary(self, cfg) -> bool:
        """A language model has one side, so one vocabulary; a source's <eos> has no source to end."""
        if cfg.source_eos:
            raise ConfigError(f"{self.name}.tokenize.source_eos: applies to translation tasks, not {self.name} "
                              "(a language model)")
        return True

    def tokenizer_texts(self, cfg, data_dir: Path, side: str) -> Iterable[str]:
        """The training text (a language model has one side)."""
        return [read_text(data_dir, "train")]
