"""The fetch stage's means: a task's source files downloaded, or copied from a local copy, into sources/<task>.

A download is streamed to a temporary file and checked against its published sha256 before it counts;
lib.tasks.writing.run_fetch writes the directory whole (lib.core.files.atomic_dir), so a failed or
cut download leaves nothing that looks complete. manifest.json says where each file came from.
"""

import hashlib
import json
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lib.core.config import ConfigError

HUB_SPLITS = {"train": "train", "valid": "validation", "test": "test"}  # our split name -> the hub's

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class NothingToFetch:
    """The fetch section of a task whose data prepare makes (cumsum): it has no keys."""


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def offline_fix(key: str, what: str) -> str:
    """The second half of every failed fetch's line: how to work without internet."""
    return f"without internet, point {key} at {what}: dvc exp run -S {key}=/path/to/copy"


def download(url: str, dest: Path, key: str, expected: str | None, local_copy: str):
    """``url`` into ``dest``; a sha256 other than ``expected`` (None: not checked) fails, naming both."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as file:  # noqa: S310 - the URL is the task's own https source
            shutil.copyfileobj(response, file, 1 << 20)
    except (OSError, ValueError) as err:  # URLError and HTTPError are OSErrors; a malformed URL a ValueError
        if isinstance(err, OSError) and err.errno is not None and not isinstance(err, urllib.error.URLError):
            raise  # writing dest failed (a full disk): the machine's refusal, not the network's
        reason = err if isinstance(err, urllib.error.HTTPError) else getattr(err, "reason", None) or err
        reason = getattr(reason, "strerror", None) or reason  # "Connection refused", not "[Errno 111] ..."
        raise ConfigError(f"{key}: could not download {url} ({reason}); {offline_fix(key, local_copy)}") from None
    if expected and (found := sha256(dest)) != expected:
        raise ConfigError(f"{key}: {url}: its sha256 is {found}, not the published {expected} (a damaged or "
                          "changed file); nothing was kept")


def write_manifest(out_dir: Path, source: str, files: list[str]):
    """manifest.json: the source, and each file fetched from it with its sha256."""
    entries = {name: sha256(out_dir / name) for name in sorted(files)}
    (out_dir / MANIFEST).write_text(json.dumps({"source": source, "files": entries}, indent=2) + "\n")


def read_manifest(source_dir: str | Path, task: str) -> dict:
    path = Path(source_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing: not a directory the fetch stage wrote (dvc repro fetch@{task})")
    return json.loads(path.read_text())

