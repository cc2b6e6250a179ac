"""Tiny Shakespeare, a character-level language model (Karpathy's char-rnn data, as nanoGPT uses it).

The text (1,115,394 characters) is split as is customary, so that losses
compare with published ones: the first 90% of characters train, the last 10%
validate.
"""

import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lib.config import ConfigError, require, utf8_text
from lib.data import read_text, text_path

KIND = "lm"
HEADLINE = ("loss", "bits_per_char")  # reports/index.md


@dataclass(frozen=True)
class PrepareConfig:
    source: str  # a local file path (relative to the repository root) or an http(s) URL of the raw text
    train_fraction: float  # leading share of characters for training; the rest validates

    def __post_init__(self):
        require(0.0 < self.train_fraction < 1.0, "train_fraction", "must be in (0, 1)")
        object.__setattr__(self, "source", os.path.expanduser(self.source))  # ~/input.txt: in the home directory
        if not self.source.startswith(("http://", "https://")):
            require(Path(self.source).is_file(), "source", f"{self.source}: no such file")


def load_source(source: str) -> str:
    if source.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(source, timeout=60) as response:  # noqa: S310 (the user's own URL)
                raw = response.read()
        except (OSError, ValueError) as err:  # URLError and HTTPError are OSErrors; a malformed URL a ValueError
            reason = err if isinstance(err, urllib.error.HTTPError) else getattr(err, "reason", None) or err
            raise ConfigError(f"shakespeare.prepare.source: {source}: could not be downloaded ({reason}); "
                              "without internet, give the path of a local copy") from None
    else:
        raw = Path(source).read_bytes()
    try:
        return utf8_text(raw, source)
    except ValueError as err:  # not UTF-8, named by line
        raise ConfigError(f"shakespeare.prepare.source: {err}") from None


def prepare(cfg: PrepareConfig, out_dir: Path):
    """Write train.txt and valid.txt: the text cut at train_fraction of its characters."""
    text = load_source(cfg.source)
    if not text:
        raise ConfigError(f"shakespeare.prepare.source: {cfg.source} is empty")
    cut = int(len(text) * cfg.train_fraction)
    text_path(out_dir, "train").write_text(text[:cut], encoding="utf-8")
    text_path(out_dir, "valid").write_text(text[cut:], encoding="utf-8")


def tokenizer_texts(cfg, data_dir: Path, side: str) -> list[str]:
    """The training text (a language model has one side)."""
    return [read_text(data_dir, "train")]
