"""Multi30k task 1 (Elliott et al., 2016): image captions translated, German <-> English (or French, Czech).

train 29,000 / valid 1,014 / test (test_2016_flickr) 1,000 sentence pairs.
fetch downloads the raw task-1 files ``{train,val,test_2016_flickr}.{lang}.gz``
from the official repository, pinned to a commit, each checked against its
sha256; a local directory of them is copied as it is. A Hugging Face hub data
set (``name@revision``) or a local folder in its shape works too. Lines are
Unicode-NFC normalised and stripped; scores are sacreBLEU's BLEU and chrF on
detokenised, cased text against the raw references.
"""

import gzip
import os
import re
import shutil
import unicodedata
import zlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lib.core.config import ConfigError, require
from lib.core.text import utf8_lines
from lib.data.pairs import split_path
from lib.data.sources import HUB_SPLITS, download, is_url, offline_fix, read_manifest
from lib.tasks.translation import TranslationTask

LANGUAGES = ("de", "en", "fr", "cs")
# Our split name -> the raw files' prefix (the hub data set's split: lib.data.sources.HUB_SPLITS).
SPLIT_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
# The official raw files (github.com/multi30k/dataset, data/task1/raw, at commit a3d2e0d) and their sha256.
SHA256 = {
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
}
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")  # owner/name, or owner/name@revision
LOCAL_COPY = "a local directory holding the raw task-1 files"


def raw_files(languages) -> list[str]:
    return [f"{prefix}.{lang}.gz" for prefix in SPLIT_FILES.values() for lang in languages]


@dataclass(frozen=True)
class FetchConfig:
    # The raw files' URL (the directory holding them), a local directory of them, or a Hugging Face hub data
    # set (owner/name[@revision]) or a local folder in its shape (train/validation/test files, a column per language).
    source: str
    languages: tuple[str, ...]  # the languages fetched; prepare translates between two of them

    def __post_init__(self):
        object.__setattr__(self, "source", os.path.expanduser(self.source))  # ~/multi30k: in the home directory
        require(len(self.languages) >= 2, "languages", "name at least two (a pair to translate between)")
        for lang in self.languages:
            require(lang in LANGUAGES, "languages", f"{lang!r} is not one of {LANGUAGES}")
        require(len(set(self.languages)) == len(self.languages), "languages", "names a language twice")


def fetch_hub(cfg: FetchConfig, out_dir: Path) -> list[str]:
    """A hub data set (or a local folder in its shape) through ``datasets``: each split's language columns."""
    import datasets  # imported here: slow to import, and only this source needs it

    name, _, revision = cfg.source.partition("@")
    try:
        loaded = datasets.load_dataset(name, revision=revision or None)
    except Exception as err:  # noqa: BLE001 - no internet, unknown name: datasets raises many kinds
        raise ConfigError(f"multi30k.fetch.source: could not load {cfg.source!r} as a Hugging Face data set "
                          f"({type(err).__name__}: {err}); {offline_fix('multi30k.fetch.source', LOCAL_COPY)}"
                          ) from None
    if missing := [split for split in HUB_SPLITS.values() if split not in loaded]:
        raise ValueError(f"multi30k.fetch.source: {cfg.source} has no {missing[0]} split (it has: "
                         f"{', '.join(loaded)})")
    files = []
    for split, hub_split in HUB_SPLITS.items():
        columns = loaded[hub_split].column_names
        for lang in cfg.languages:
            require(lang in columns, "multi30k.fetch.languages",
                    f"{lang!r} is not in {cfg.source} (its {hub_split} split has: {', '.join(columns)})")
        loaded[hub_split].select_columns(list(cfg.languages)).to_pandas().to_parquet(split_path(out_dir, split))
        files.append(split_path(out_dir, split).name)
    return files


@dataclass(frozen=True)
class PrepareConfig:
    src_lang: str  # the language translated from
    tgt_lang: str  # the language translated into

    def __post_init__(self):
        for name in ("src_lang", "tgt_lang"):
            require(getattr(self, name) in LANGUAGES, name, f"{getattr(self, name)!r} is not one of {LANGUAGES}")
        require(self.src_lang != self.tgt_lang, "tgt_lang", "must differ from src_lang")


def read_lines(path: Path) -> list[str]:
    """NFC-normalised, stripped lines of a gzipped (or plain) UTF-8 file; bad bytes and empty lines fail."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (multi30k.fetch.source must hold the raw task-1 files)")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:  # cut short, a flipped byte, or not gzip at all
        raise ValueError(f"{path}: not a whole gzip file ({err or type(err).__name__})") from None
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


def check_fetched(cfg: PrepareConfig, languages: list[str]):
    """Both languages of the pair among ``languages``, those the fetched files hold."""
    for name in ("src_lang", "tgt_lang"):
        lang = getattr(cfg, name)
        require(lang in languages, f"multi30k.prepare.{name}",
                f"{lang!r} was not fetched (the source files hold {', '.join(languages)}): add it to "
                "multi30k.fetch.languages")


def load_raw(cfg: PrepareConfig, root: Path, fetched: list[str]) -> dict[str, pd.DataFrame]:
    check_fetched(cfg, sorted({name.split(".")[-2] for name in fetched}))
    splits = {}
    for split, prefix in SPLIT_FILES.items():
        src_path, tgt_path = root / f"{prefix}.{cfg.src_lang}.gz", root / f"{prefix}.{cfg.tgt_lang}.gz"
        src, tgt = read_lines(src_path), read_lines(tgt_path)
        if len(src) != len(tgt):
            raise ValueError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: not parallel")
        splits[split] = pd.DataFrame({"src": src, "tgt": tgt})
    return splits


def load_hub(cfg: PrepareConfig, root: Path, source: str) -> dict[str, pd.DataFrame]:
    """The hub data set's splits, as fetch wrote them: one column per language code."""
    splits = {split: pd.read_parquet(split_path(root, split)) for split in HUB_SPLITS}
    check_fetched(cfg, list(splits["train"].columns))
    for split, frame in splits.items():
        columns = {}
        for side, lang in (("src", cfg.src_lang), ("tgt", cfg.tgt_lang)):
            texts = []
            for number, text in enumerate(frame[lang], start=1):
                text = unicodedata.normalize("NFC", text or "").strip()
                if not text:
                    raise ValueError(f"{source}: split {HUB_SPLITS[split]}, row {number}: empty {lang} sentence")
                texts.append(text)
            columns[side] = texts
        splits[split] = pd.DataFrame(columns)
    return splits


class Multi30k(TranslationTask):
    """Multi30k task 1: image captions, German -> English by default."""

    name = "multi30k"
    FetchConfig = FetchConfig
    PrepareConfig = PrepareConfig
    fetched = ("*.gz", "train.parquet", "valid.parquet", "test.parquet")  # the raw files, or a hub data set's

    def fetch(self, cfg: FetchConfig, out_dir: Path) -> list[str]:
        """The raw files (downloaded and checked, or copied), or the hub data set's splits as parquet files."""
        key, source = "multi30k.fetch.source", cfg.source
        if is_url(source):
            for name in raw_files(cfg.languages):
                download(f"{source.rstrip('/')}/{name}", out_dir / name, key, SHA256[name], LOCAL_COPY)
            return raw_files(cfg.languages)
        root = Path(source)
        if root.is_dir() and any(root.glob("train.*.gz")):
            for name in raw_files(cfg.languages):
                if not (root / name).is_file():
                    raise FileNotFoundError(f"{root / name}: missing ({key} must hold the raw task-1 files of "
                                            f"multi30k.fetch.languages {list(cfg.languages)})")
                shutil.copyfile(root / name, out_dir / name)
            return raw_files(cfg.languages)
        if root.is_dir() or HUB_NAME.fullmatch(source):
            return fetch_hub(cfg, out_dir)
        raise ConfigError(f"{key}: {source}: no such directory (give the raw files' URL, as params.yaml does, "
                          f"{LOCAL_COPY}, or a Hugging Face hub data set)")

    def prepare(self, cfg: PrepareConfig, out_dir: Path, source_dir: Path):
        """Write train/valid/test parquet files (columns src, tgt) from the fetched files."""
        manifest = read_manifest(source_dir, "multi30k")
        fetched = list(manifest["files"])
        hub = split_path(source_dir, "train").name in fetched
        splits = load_hub(cfg, source_dir, manifest["source"]) if hub else load_raw(cfg, source_dir, fetched)
        for split, frame in splits.items():
            frame.to_parquet(split_path(out_dir, split), index=False)
