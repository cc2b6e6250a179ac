"""Tiny Shakespeare, a character-level language model (Karpathy's char-rnn data, as nanoGPT uses it).

The text (1,115,394 characters) is split as is customary, so that losses
compare with published ones: the first 90% of characters train, the last 10%
validate.
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from lib.core.config import ConfigError, require
from lib.core.text import utf8_text
from lib.data.pairs import text_path
from lib.data.sources import download, is_url, sha256
from lib.tasks.base import LMTask

TEXT = "input.txt"  # the fetched text, in sources/shakespeare


@dataclass(frozen=True)
class FetchConfig:
    source: str  # an http(s) URL of the raw text, or a local file (relative to the repository root)
    sha256: str = ""  # the text's sha256, checked after the download or copy ("": not checked)

    def __post_init__(self):
        object.__setattr__(self, "source", os.path.expanduser(self.source))  # ~/input.txt: in the home directory
        if not is_url(self.source):
            require(Path(self.source).is_file(), "source", f"{self.source}: no such file (give the text's URL, "
                    "as params.yaml does, or a local copy)")
        require(self.sha256 == "" or len(self.sha256) == 64 and all(c in "0123456789abcdef" for c in self.sha256),
                "sha256", f"{self.sha256!r} is not a sha256 (64 lowercase hex digits) or \"\"")


@dataclass(frozen=True)
class PrepareConfig:
    train_fraction: float  # leading share of characters for training; the rest validates

    def __post_init__(self):
        require(0.0 < self.train_fraction < 1.0, "train_fraction", "must be in (0, 1)")


class Shakespeare(LMTask):
    """Tiny Shakespeare: a character-level language model."""

    name = "shakespeare"
    FetchConfig = FetchConfig
    PrepareConfig = PrepareConfig
    fetched = (TEXT,)

    def fetch(self, cfg: FetchConfig, out_dir: Path) -> list[str]:
        """The text, downloaded or copied, and checked against cfg.sha256."""
        dest = out_dir / TEXT
        if is_url(cfg.source):
            download(cfg.source, dest, "shakespeare.fetch.source", cfg.sha256 or None, "a local copy of the text")
        else:
            shutil.copyfile(cfg.source, dest)
            if cfg.sha256 and (found := sha256(dest)) != cfg.sha256:
                raise ConfigError(f"shakespeare.fetch.source: {cfg.source}: its sha256 is {found}, not "
                                  f"shakespeare.fetch.sha256 {cfg.sha256} (another text: set that to \"\" or to its "
                                  "sum)")
        return [TEXT]

    def prepare(self, cfg: PrepareConfig, out_dir: Path, source_dir: Path):
        """Write train.txt and valid.txt: the text cut at train_fraction of its characters."""
        path = Path(source_dir) / TEXT
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing: not a directory the fetch stage wrote "
                                    "(dvc repro fetch@shakespeare)")
        try:
            text = utf8_text(path.read_bytes(), path)
        except ValueError as err:  # not UTF-8, named by line
            raise ConfigError(f"shakespeare.fetch.source: {err}") from None
        if not text:
            raise ConfigError(f"shakespeare.fetch.source: {path} is empty")
        cut = int(len(text) * cfg.train_fraction)
        if min(cut, len(text) - cut) < 2:  # a split needs a character to read and one to predict
            raise ConfigError(f"shakespeare.fetch.source: {path} holds {len(text)} characters: too short to cut into a "
                              f"training and a validation text of two characters or more at prepare.train_fraction "
                              f"{cfg.train_fraction} (give a longer text)")
        text_path(out_dir, "train").write_text(text[:cut], encoding="utf-8")
        text_path(out_dir, "valid").write_text(text[cut:], encoding="utf-8")
