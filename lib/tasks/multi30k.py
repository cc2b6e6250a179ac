"""Multi30k task 1 (Elliott et al., 2016): image captions translated, German <-> English.

train 29,000 / valid 1,014 / test (test_2016_flickr) 1,000 sentence pairs.
Read from a local directory holding the raw task-1 files
``{train,val,test_2016_flickr}.{de,en}.gz``, or from a Hugging Face hub data
set through ``datasets`` where there is internet. Lines are Unicode-NFC
normalised and stripped; scores are sacreBLEU's BLEU and chrF on detokenised,
cased text against the raw references.
"""

import gzip
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import sacrebleu

from lib.config import ConfigError, require, utf8_lines
from lib.data import read_split, split_path

KIND = "seq2seq"
HEADLINE = ("greedy.bleu", "beam*.bleu", "greedy.chrf", "valid_perplexity")  # reports/index.md
LANGUAGES = ("de", "en", "fr", "cs")
# Our split name -> the raw files' prefix and the hub data set's split.
SPLIT_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
HUB_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
# Source lengths in words, for BLEU by length: each group holds 75-234 of the 1,000 test sentences.
LENGTH_GROUPS = ((1, 7), (8, 9), (10, 11), (12, 13), (14, 16), (17, None))


@dataclass(frozen=True)
class PrepareConfig:
    # A local directory with the raw gzipped files, or a hub data set name (bentrevett/multi30k).
    source: str
    src_lang: str  # the language translated from
    tgt_lang: str  # the language translated into

    def __post_init__(self):
        object.__setattr__(self, "source", os.path.expanduser(self.source))  # ~/multi30k: in the home directory
        for name in ("src_lang", "tgt_lang"):
            require(getattr(self, name) in LANGUAGES, name, f"{getattr(self, name)!r} is not one of {LANGUAGES}")
        require(self.src_lang != self.tgt_lang, "tgt_lang", "must differ from src_lang")

    @property
    def is_local(self) -> bool:
        return Path(self.source).is_dir() or self.source.startswith((".", "/"))


def read_lines(path: Path) -> list[str]:
    """NFC-normalised, stripped lines of a gzipped (or plain) UTF-8 file; bad bytes and empty lines fail."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (multi30k.prepare.source must hold the raw task-1 files)")
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = utf8_lines(raw, path)
    if not lines:
        raise ValueError(f"{path}: empty file")
    out = []
    for number, line in enumerate(lines, start=1):
        text = unicodedata.normalize("NFC", line).strip()
        if not text:
            raise ValueError(f"{path}: line {number}: empty line")
        out.append(text)
    return out


def load_local(cfg: PrepareConfig) -> dict[str, pd.DataFrame]:
    root = Path(cfg.source)
    if not root.is_dir():
        raise FileNotFoundError(f"multi30k.prepare.source: {root}: no such directory")
    splits = {}
    for split, prefix in SPLIT_FILES.items():
        src_path, tgt_path = root / f"{prefix}.{cfg.src_lang}.gz", root / f"{prefix}.{cfg.tgt_lang}.gz"
        src, tgt = read_lines(src_path), read_lines(tgt_path)
        if len(src) != len(tgt):
            raise ValueError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: not parallel")
        splits[split] = pd.DataFrame({"src": src, "tgt": tgt})
    return splits


def load_hub(cfg: PrepareConfig) -> dict[str, pd.DataFrame]:
    """The data set from the Hugging Face hub: one column per language code."""
    import datasets  # imported here: slow to import, and only this source needs it

    try:
        loaded = datasets.load_dataset(cfg.source)
    except Exception as err:  # noqa: BLE001 - no internet, unknown name: datasets raises many kinds
        raise ConfigError(f"multi30k.prepare.source: {cfg.source!r} is not a local directory and could not be "
                          f"loaded from the Hugging Face hub ({type(err).__name__}: {err})") from None
    splits = {}
    for split, hub_split in HUB_SPLITS.items():
        rows = loaded[hub_split]
        columns = {}
        for side, lang in (("src", cfg.src_lang), ("tgt", cfg.tgt_lang)):
            texts = []
            for number, text in enumerate(rows[lang], start=1):
                text = unicodedata.normalize("NFC", text or "").strip()
                if not text:
                    raise ValueError(f"{cfg.source}: split {hub_split}, row {number}: empty {lang} sentence")
                texts.append(text)
            columns[side] = texts
        splits[split] = pd.DataFrame(columns)
    return splits


def prepare(cfg: PrepareConfig, out_dir: Path):
    """Write train/valid/test parquet files (columns src, tgt)."""
    splits = load_local(cfg) if cfg.is_local else load_hub(cfg)
    for split, frame in splits.items():
        frame.to_parquet(split_path(out_dir, split), index=False)


def tokenizer_texts(cfg, data_dir: Path, side: str) -> list[str]:
    """The training split only: its sources, its targets, or both (a joint vocabulary)."""
    train = read_split(data_dir, "train")
    columns = {"source": ["src"], "target": ["tgt"], "both": ["src", "tgt"]}[side]
    return [text for column in columns for text in train[column].tolist()]


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU (13a tokenisation, cased) and chrF, with the signatures that say how."""
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {"bleu": bleu_score.score, "chrf": chrf_score.score,
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


def length_group(source: str) -> str:
    """The LENGTH_GROUPS label of a source's length in words: "01-07", ..., "17+" (zero-padded, so
    that `dvc metrics show`, which sorts as text, lists them shortest first)."""
    words = len(source.split())
    for low, high in LENGTH_GROUPS:
        if high is None:
            return f"{low:02d}+"
        if words <= high:
            return f"{low:02d}-{high:02d}"


def breakdown(sources: list[str], hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU of the (greedy) test translations by the source's length in words: where longer
    sentences lose. Groups with no sentence are left out."""
    groups = pd.DataFrame({"group": [length_group(s) for s in sources], "hyp": hypotheses, "ref": references})
    return {"bleu_by_length": {group: score(rows["hyp"].tolist(), rows["ref"].tolist())["bleu"]
                               for group, rows in groups.groupby("group")}}


def sentence_score(hypothesis: str, reference: str) -> float:
    """Per-sentence BLEU (smoothed), for finding the worst translations."""
    return sacrebleu.sentence_bleu(hypothesis, [reference]).score
