"""Runs as DVC names them (a commit, a branch, a tag, an experiment, or the workspace), read through DVC's own
interface: ``dvc.api`` gives a revision's files from git or from the cache; the workspace is read from disk.

A file that git keeps (metrics.json, the curves' CSVs, params.yaml) is there for every revision. An output that
DVC keeps (samples.jsonl) is there only while its version is in the local cache: where it is not, the error
says which command brings it back.
"""

import io
import json
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd

from lib.core.config import flatten
from lib.core.text import parse_yaml

WORKSPACE = "workspace"


class RunError(ValueError):
    """A run that cannot be read: a name that is no revision, or a file it lacks."""


class NotInCache(RunError):
    """An output of the run that DVC tracks but the local cache does not hold."""


def experiment_refs(root: Path) -> dict[str, list[tuple[str, str]]]:
    """Each experiment name with its (baseline commit, experiment commit) pairs, from git's refs/exps."""
    lines = git(root, "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps").splitlines()
    found: dict[str, list[tuple[str, str]]] = {}
    for line in lines:
        ref, sha = line.split()
        parts = ref.split("/")  # refs/exps/<baseline[:2]>/<baseline[2:]>/<name>
        if len(parts) == 5:
            found.setdefault(parts[4], []).append((parts[2] + parts[3], sha))
    return found


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def resolve(root: Path, name: str) -> str | None:
    """The commit that ``name`` names: an experiment (the one on HEAD's baseline where names repeat), or
    anything git resolves. None: the workspace."""
    if name == WORKSPACE:
        return None
    experiments = experiment_refs(root)
    if name in experiments:
        head = git(root, "rev-parse", "HEAD")
        on_head = [sha for baseline, sha in experiments[name] if baseline == head]
        return (on_head or [sha for _, sha in experiments[name]])[-1]
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], cwd=root,
                           capture_output=True, text=True)
    if found.returncode:
        raise RunError(f"{name}: neither an experiment (`dvc exp list`) nor a git revision, nor {WORKSPACE!r}")
    return found.stdout.strip()


@dataclass
class Run:
    """One run: its ``name`` as given, and the commit it resolves to (None: the workspace)."""

    name: str
    root: Path
    rev: str | None

    @classmethod
    def named(cls, name: str, root: Path) -> "Run":
        return cls(name, root, resolve(root, name))

    def read(self, path: str) -> bytes:
        """The run's file at ``path`` (relative to the repository)."""
        if self.rev is None:
            file = self.root / path
            if not file.is_file():
                raise RunError(f"{self.name}: {path} not found (`dvc repro` builds it)")
            return file.read_bytes()
        import dvc.api  # DVC's repository machinery: loaded only for a revision
        from dvc.exceptions import PathMissingError
        from dvc_data.index import DataIndexDirError

        try:
            return dvc.api.read(path, repo=str(self.root), rev=self.rev, mode="rb")
        except (PathMissingError, DataIndexDirError):  # the file, or the output directory holding it, not cached
            if self.tracks(path):
                raise NotInCache(
                    f"{self.name}: {path} is not in the local cache. Bring it back with `dvc exp pull <remote> "
                    f"{self.name}` (an experiment) or `dvc pull` at that commit, or rebuild it: `dvc exp apply "
                    f"{self.name}` (or `git checkout {self.name}`), then `dvc repro`") from None
            raise RunError(f"{self.name}: {path} not found in that revision") from None

    def tracks(self, path: str) -> bool:
        """Whether the run's dvc.lock names ``path`` as an output (or one inside an output directory)."""
        try:
            lock = parse_yaml(git(self.root, "show", f"{self.rev}:dvc.lock"), f"{self.name}:dvc.lock")
        except subprocess.CalledProcessError:
            return False
        outs = [out["path"] for stage in (lock or {}).get("stages", {}).values() for out in stage.get("outs", [])]
        return any(path == out or path.startswith(out.rstrip("/") + "/") for out in outs)

    def json(self, path: str) -> dict:
        return json.loads(self.read(path))

    def csv(self, path: str, sep: str = ",") -> pd.DataFrame:
        return pd.read_csv(io.BytesIO(self.read(path)), sep=sep)

    @cached_property
    def params(self) -> dict:
        params = parse_yaml(self.read("params.yaml").decode(), f"{self.name}:params.yaml")
        if not isinstance(params, dict):
            raise RunError(f"{self.name}: params.yaml is not a mapping of params")
        return params

    @property
    def tasks(self) -> list[str]:
        tasks = self.params.get("tasks")
        return tasks if isinstance(tasks, list) else []

    def task_params(self, task: str) -> dict:
        """The task's params as dotted keys, ``<task>.train.epochs``."""
        return flatten(self.params.get(task) or {}, f"{task}.")

    def samples(self, task: str) -> pd.DataFrame:
        """The task's test outputs (samples.jsonl's test split), in the test set's order."""
        frame = pd.read_json(io.BytesIO(self.read(f"reports/{task}/samples.jsonl")), lines=True)
        if "split" not in frame:  # an LM's: its samples are drawn text, not test outputs
            return frame
        return frame[frame["split"] == "test"].reset_index(drop=True)
