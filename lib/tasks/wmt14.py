"""WMT 2014 English -> German, the paper's own task (sec. 5.1): 4,508,785 training pairs, newstest2013 to
validate (3,000), newstest2014 to test (3,003).

fetch loads the Hugging Face data set ``wmt/wmt14`` (config ``de-en``), pinned to a revision, through
``datasets``, or a local folder in its layout (``de-en/train-*.parquet``, ``validation-*``, ``test-*``), and
writes each split as one parquet file of its ``translation`` column, a batch of rows at a time. prepare
streams them the same way: each text NFC-normalised and stripped, the training pairs cleaned by length
and length ratio (newstest is kept whole), and ``cleaning.json`` counts what was dropped and why. Scores
are multi30k's (sacreBLEU's BLEU and chrF on detokenised, cased text) and the paper's tokenised BLEU.
"""

import json
import os
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lib.core.config import ConfigError, require
from lib.data.pairs import split_path
from lib.data.sources import HUB_SPLITS, offline_fix, read_manifest
from lib.tasks import translation
from lib.tasks.translation import TranslationTask

LANGUAGES = ("en", "de")
BATCH_ROWS = 100_000  # rows read, cleaned and written at a time: the corpus is never whole in memory
CLEANING = "cleaning.json"
PAPER_ROWS = {"train": 4_508_785, "validation": 3_000, "test": 3_003}  # WMT 2014 en-de (sec. 5.1), the hub's splits
LOCAL_COPY = "a local folder of the data set's parquet files (de-en/train-*.parquet, validation-*, test-*)"


@dataclass(frozen=True)
class FetchConfig:
    source: str  # the hub data set, owner/name@revision, or a local folder in its layout
    config: str = "de-en"  # the data set's configuration: its language pair

    def __post_init__(self):
        object.__setattr__(self, "source", os.path.expanduser(self.source))


@dataclass(frozen=True)
class PrepareConfig:
    src_lang: str = "en"  # the language translated from (the paper: English -> German)
    tgt_lang: str = "de"  # the language translated into
    max_words: int = 100  # a training pair with a side of more words is dropped (newstest is kept whole)
    max_ratio: float = 3.0  # ... and one with a side this many times the other's words (a misaligned pair)

    def __post_init__(self):
        for name in ("src_lang", "tgt_lang"):
            require(getattr(self, name) in LANGUAGES, name, f"{getattr(self, name)!r} is not one of {LANGUAGES}")
        require(self.src_lang != self.tgt_lang, "tgt_lang", "must differ from src_lang")
        require(self.max_words >= 1, "max_words", "must be >= 1")
        require(self.max_ratio >= 1, "max_ratio", "must be >= 1")


def batches(path: Path, src_lang: str, tgt_lang: str) -> Iterator[tuple[list[str], list[str]]]:
    """The split fetch wrote, a batch of rows at a time: its source and target texts, NFC-normalised and
    stripped."""
    try:
        file = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as err:
        raise ValueError(f"{path}: not a parquet file fetch wrote ({err}); re-run the fetch stage") from None
    for batch in file.iter_batches(batch_size=BATCH_ROWS, columns=["translation"]):
        pairs = batch.column("translation")
        texts = [[unicodedata.normalize("NFC", text or "").strip() for text in pairs.field(lang).to_pylist()]
                 for lang in (src_lang, tgt_lang)]
        yield texts[0], texts[1]


def dropped_why(src: str, tgt: str, cfg: PrepareConfig) -> str | None:
    """Why standard cleaning drops a training pair (an empty side, a side too long, sides of very unequal
    lengths), or None to keep it."""
    if not src or not tgt:
        return "empty"
    s, t = len(src.split()), len(tgt.split())
    if max(s, t) > cfg.max_words:
        return "too_long"
    if max(s, t) > cfg.max_ratio * min(s, t):
        return "ratio"
    return None


def check_rows(source: str, rows: dict[str, int]):
    """The hub's de-en splits must hold the paper's WMT 2014 (PAPER_ROWS): another revision, a partial download
    or a changed data set is named, split by split, before anything is written."""
    differ = [f"{split} {rows.get(split, 0):,} (expected {n:,})" for split, n in PAPER_ROWS.items()
              if rows.get(split) != n]
    if differ:
        raise ValueError(f"wmt14.fetch.source: {source} holds {', '.join(differ)} rows, not WMT 2014 en-de as "
                         "the paper used it; pin the revision params.yaml ships, or use a local copy of it")


SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


class WMT14(TranslationTask):
    """WMT 2014 English -> German, the paper's task: sacreBLEU and the paper's tokenised BLEU."""

    name = "wmt14"
    FetchConfig = FetchConfig
    PrepareConfig = PrepareConfig
    scores = (*TranslationTask.scores, "tokenized_bleu")
    headline = ("greedy.bleu", "beam*.bleu", "beam*.tokenized_bleu", "valid_perplexity")
    token_store = True
    long_test = "cut"  # newstest2014 scored whole: a sentence over max_len is decoded from its first max_len tokens
    fetched = ("train.parquet", "valid.parquet", "test.parquet")
    prepared = (*TranslationTask.prepared, CLEANING)

    def score(self, hypotheses: list[str], references: list[str]) -> dict:
        """sacreBLEU's BLEU and chrF, with the paper's tokenised BLEU beside them (cheap to compute)."""
        return {**translation.score(hypotheses, references), **translation.tokenized_bleu(hypotheses, references)}

    def fetch(self, cfg: FetchConfig, out_dir: Path) -> list[str]:
        """Each split's translation column as ``<split>.parquet``, written a batch of rows at a time."""
        import datasets  # imported here: slow to import

        local = Path(cfg.source).is_dir()
        name, _, revision = cfg.source.partition("@")
        try:
            loaded = (datasets.load_dataset(cfg.source, data_dir=cfg.config) if local else
                      datasets.load_dataset(name, cfg.config, revision=revision or None))
        except Exception as err:  # noqa: BLE001 - no internet, unknown name or revision: datasets raises many kinds
            raise ConfigError(f"wmt14.fetch.source: could not load {cfg.source!r} as a Hugging Face data set "
                              f"({type(err).__name__}: {err}); {offline_fix('wmt14.fetch.source', LOCAL_COPY)}"
                              ) from None
        if not local and cfg.config == "de-en":
            check_rows(cfg.source, {split: loaded[split].num_rows for split in PAPER_ROWS if split in loaded})
        files = []
        for split, hub_split in HUB_SPLITS.items():
            if hub_split not in loaded:
                raise ValueError(f"wmt14.fetch.source: {cfg.source} has no {hub_split} split (it has: "
                                 f"{', '.join(loaded)})")
            if "translation" not in loaded[hub_split].column_names:
                raise ValueError(f"wmt14.fetch.source: {cfg.source}'s {hub_split} split has no translation column "
                                 f"(it has: {', '.join(loaded[hub_split].column_names)})")
            loaded[hub_split].select_columns(["translation"]).to_parquet(split_path(out_dir, split),
                                                                        batch_size=BATCH_ROWS)
            files.append(split_path(out_dir, split).name)
        return files

    def prepare(self, cfg: PrepareConfig, out_dir: Path, source_dir: Path):
        """train/valid/test.parquet (columns src, tgt), streamed from the fetched splits; cleaning.json says
        how many training pairs each rule dropped."""
        manifest = read_manifest(source_dir, "wmt14")
        counts = {}
        for split in HUB_SPLITS:
            path = split_path(source_dir, split)
            if path.name not in manifest["files"]:
                raise FileNotFoundError(f"{path}: not fetched (re-run the fetch stage)")
            read, dropped = 0, {"empty": 0, "too_long": 0, "ratio": 0}
            with pq.ParquetWriter(split_path(out_dir, split), SCHEMA) as writer:
                for src, tgt in batches(path, cfg.src_lang, cfg.tgt_lang):
                    keep_src, keep_tgt = [], []
                    for number, (s, t) in enumerate(zip(src, tgt), read + 1):
                        why = dropped_why(s, t, cfg) if split == "train" else None
                        if split != "train" and (not s or not t):
                            raise ValueError(f"{path}: row {number}: an empty sentence in {HUB_SPLITS[split]}, "
                                             "which is scored whole")
                        if why:
                            dropped[why] += 1
                        else:
                            keep_src.append(s)
                            keep_tgt.append(t)
                    read += len(src)
                    writer.write_table(pa.table({"src": keep_src, "tgt": keep_tgt}, schema=SCHEMA))
            if not read:
                raise ValueError(f"{path}: no rows")
            counts[split] = {"read": read, "kept": read - sum(dropped.values()), "dropped": dropped}
        (out_dir / CLEANING).write_text(json.dumps(counts, indent=1) + "\n")

    def tokenizer_texts(self, cfg, data_dir: Path, side: str) -> Iterator[str]:
        """The training split's sources, targets or both, a batch at a time: BPE learns from an iterator."""
        columns = {"source": ["src"], "target": ["tgt"], "both": ["src", "tgt"]}[side]
        file = pq.ParquetFile(split_path(data_dir, "train"))
        for batch in file.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            for column in columns:
                yield from batch.column(column).to_pylist()
