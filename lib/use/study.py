"""A study: runs declared in a file as params overrides, queued in DVC's experiment queue, and read back as one
table by ``python -m lib.use.compare --study``.

    python -m lib.use.study studies/table3_multi30k.yaml                 # queue every row (dvc exp run --queue)
    python -m lib.use.study studies/table3_multi30k.yaml --rows base,A1  # some of them
    dvc queue start                                                       # runs them one at a time
    dvc queue status
    python -m lib.use.compare --study studies/table3_multi30k.yaml       # the table: reports/compare/

``--run`` runs the queue at once and follows it (`dvc exp run --run-all`). A study file (YAML):

    description: what the study asks
    task: cumsum                       # the task its table reads
    set: {cumsum.train.epochs: 1}      # every row's overrides, as `dvc exp run -S` takes them
    rows:                              # each row's own; the first row is the base the others are tested against
      base: {}
      heads-1: {cumsum.train.model.n_heads: 1}
    columns:                           # the table's: label -> key, or {key, per, prefer, scale, digits}
      h: params.train.model.n_heads    # params.<the task's key>, or metrics.<key> (python -m lib.use.compare's)
      d_k: {key: params.train.model.d_model, per: params.train.model.n_heads, prefer: params.train.model.d_head}
      exact match: metrics.greedy.exact_match
    test: greedy.exact_match           # tested against the base row (default: the task's first headline metric)

Row ``r`` of study ``s`` (the file's name) runs as the experiment ``s-r``. Every row's params are checked as
each stage will check them before anything is queued, so a misspelt key costs a message, not a queue of
failed runs.
"""

import argparse
import copy
import dataclasses
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lib.core.config import STAGES, ConfigError
from lib.core.text import load_params, parse_yaml
from lib.report.pages import shown_value
from lib.tasks import get_task
from lib.tasks.params import check_stages_after, check_tasks

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a study's and a row's name: part of a git ref's
KEYS = ("description", "task", "set", "rows", "columns", "test")
COLUMN_KEYS = ("key", "per", "prefer", "scale", "digits")


@dataclass(frozen=True)
class Column:
    key: str  # params.<the task's dotted key> or metrics.<key>
    per: str | None = None  # divided by this key's value (d_k: d_model per head)
    prefer: str | None = None  # this key's value instead, where the run sets it (d_k: d_head)
    scale: float = 1.0
    digits: int | None = None


@dataclass(frozen=True)
class Study:
    name: str
    description: str
    task: str
    set: dict
    rows: dict[str, dict]
    columns: dict[str, Column]
    test: str | None

    def experiment(self, row: str) -> str:
        return f"{self.name}-{row}"

    def overrides(self, row: str) -> dict:
        return {**self.set, **self.rows[row]}

    def value(self, column: Column, run, metrics: dict) -> str:
        """``column``'s cell for a run (lib.use.runs.Run) with its compare metrics."""
        def lookup(key: str):
            source, _, rest = key.partition(".")
            return run.task_params(self.task).get(f"{self.task}.{rest}") if source == "params" else metrics.get(rest)

        value = lookup(column.key)
        if column.per is not None and isinstance(value, (int, float)):
            divisor = lookup(column.per)
            value = value / divisor if isinstance(divisor, (int, float)) and divisor else None
        if column.prefer is not None and lookup(column.prefer) is not None:
            value = lookup(column.prefer)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = value * column.scale
            if column.digits is not None:
                return f"{value:.{column.digits}f}"
            if isinstance(value, float) and value.is_integer() and column.per is not None:
                return str(int(value))  # a quotient that divides: d_k 32, not 32.0000
        return "-" if value is None else shown_value(value)


def fail(path: Path, message: str):
    raise ConfigError(f"{path}: {message}")


def parse_column(path: Path, label: str, raw) -> Column:
    raw = {"key": raw} if isinstance(raw, str) else raw
    if not isinstance(raw, dict) or "key" not in raw:
        fail(path, f"columns.{label}: a key (params.<key> or metrics.<key>) or a mapping with one")
    if unknown := sorted(set(raw) - set(COLUMN_KEYS)):
        fail(path, f"columns.{label}: unknown {', '.join(unknown)} (allowed: {', '.join(COLUMN_KEYS)})")
    for name in ("key", "per", "prefer"):
        if name in raw and not str(raw[name]).startswith(("params.", "metrics.")):
            fail(path, f"columns.{label}.{name}: {raw[name]!r}: starts params. (the task's params) or metrics.")
    return Column(raw["key"], raw.get("per"), raw.get("prefer"), float(raw.get("scale", 1.0)), raw.get("digits"))


def load_study(path: Path) -> Study:
    """The study in ``path``, its shape checked (not yet its params: ``check_rows``)."""
    if not path.is_file():
        fail(path, "study file not found")
    raw = parse_yaml(path.read_text(), str(path))
    if not isinstance(raw, dict):
        fail(path, "expected a mapping (description, task, set, rows, columns, test)")
    if unknown := sorted(set(raw) - set(KEYS)):
        fail(path, f"unknown key {', '.join(unknown)} (allowed: {', '.join(KEYS)})")
    if not NAME.fullmatch(path.stem):
        fail(path, "the file's name names the experiments: letters, digits, _ . - only")
    rows = raw.get("rows")
    if not isinstance(rows, dict) or not rows:
        fail(path, "rows: a mapping of row names to their overrides, the base first")
    for row, overrides in rows.items():
        if not NAME.fullmatch(str(row)):
            fail(path, f"rows.{row}: a row's name is part of its experiment's: letters, digits, _ . - only")
        if not isinstance(overrides, dict):
            fail(path, f"rows.{row}: a mapping of dotted params keys to values ({{}} for none)")
    task = raw.get("task")
    try:
        get_task(str(task))
    except (ConfigError, KeyError, ValueError) as error:
        fail(path, f"task: {error}")
    columns = raw.get("columns") or {}
    if not isinstance(columns, dict):
        fail(path, "columns: a mapping of labels to keys")
    if not isinstance(raw.get("set") or {}, dict):
        fail(path, "set: a mapping of dotted params keys to values")
    test = raw["test"] if "test" in raw else get_task(task).headline[0]  # null: none (an LM's)
    return Study(path.stem, str(raw.get("description", "")), task, dict(raw.get("set") or {}),
                 {str(row): dict(overrides) for row, overrides in rows.items()},
                 {str(label): parse_column(path, label, column) for label, column in columns.items()}, test)


def overridden(params: dict, overrides: dict, where: str) -> dict:
    """``params`` with each dotted key of ``overrides`` set, as `dvc exp run -S` sets it."""
    params = copy.deepcopy(params)
    for key, value in overrides.items():
        *parents, last = str(key).split(".")
        node = params
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{where}: {key}: {'.'.join(parents[:i + 1])} is not a section")
        node[last] = value
    return params


def check_rows(study: Study, params: dict):
    """Every row's params, checked as each stage of each of its tasks will check them; a ConfigError names the
    row and the key."""
    for row in study.rows:
        where = f"{study.name}: rows.{row}"
        changed = overridden(params, study.overrides(row), where)
        try:
            tasks = check_tasks(changed)
            if study.task not in tasks:
                raise ConfigError(f"tasks: {tasks!r} lacks the study's task {study.task!r}")
            for task in tasks:
                check_stages_after(changed, task, STAGES[0])
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None


def option(key: str, value) -> str:
    """``key=value`` as `dvc exp run -S` reads it (its value as YAML)."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def written(params: dict, key: str) -> bool:
    """Whether params.yaml spells out the dotted ``key`` (a param left to its default, as model.d_head, is not)."""
    section = params
    for part in key.split("."):
        if not isinstance(section, dict) or part not in section:
            return False
        section = section[part]
    return True


def queue_command(study: Study, row: str, params: dict) -> list[str]:
    """The row's `dvc exp run --queue`: -S key=value for each override, +key=value for a key params.yaml leaves
    to its default (DVC's -S, Hydra's syntax, changes only a key that is there, and adds one given +)."""
    sets = [arg for key, value in study.overrides(row).items()
            for arg in ("-S", ("" if written(params, key) else "+") + option(key, value))]
    return ["dvc", "exp", "run", "--queue", "-n", study.experiment(row), *sets]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lib.use.study", description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="a study file, studies/<name>.yaml")
    parser.add_argument("--rows", type=lambda text: text.split(","), help="these rows only (default: all)")
    parser.add_argument("--run", action="store_true", help="run the queue now and follow it (dvc exp run --run-all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="one more override for every row, as dvc exp run -S takes it (offline: a local source, "
                             "as an absolute path: a queued run works in a copy of the repository)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="checked against (default: here)")
    args = parser.parse_args(argv)
    try:
        study = load_study(args.study)
        for given in args.set:
            key, equals, value = given.partition("=")
            if not equals:
                raise ConfigError(f"--set {given}: expected KEY=VALUE")
            study = dataclasses.replace(study, set={**study.set, key: parse_yaml(value, f"--set {given}")})
        params = load_params(args.params)
        check_rows(study, params)
        rows = args.rows or list(study.rows)
        if unknown := [row for row in rows if row not in study.rows]:
            raise ConfigError(f"--rows: {', '.join(unknown)}: not a row of {args.study} ({', '.join(study.rows)})")
    except ConfigError as error:
        sys.exit(f"error: {error}")
    for row in rows:
        command = queue_command(study, row, params)
        print(" ".join(command), flush=True)
        if subprocess.run(command).returncode:
            sys.exit(f"error: queueing row {row} failed (above); the rows before it are queued (`dvc queue status`)")
    if args.run:
        if subprocess.run(["dvc", "exp", "run", "--run-all"]).returncode:
            sys.exit("error: a run failed (`dvc queue logs <name>`)")
        print(f"next: python -m lib.use.compare --study {args.study}")
    else:
        print(f"next: dvc queue start; when `dvc queue status` shows them done: python -m lib.use.compare --study "
              f"{args.study}")


if __name__ == "__main__":
    main()
