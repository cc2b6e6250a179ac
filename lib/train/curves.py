"""A run's curves through dvclive (train/loss, valid/loss, ...): written, repaired when a killed run resumes,
and read back for the report."""

import io
import json
import logging
from pathlib import Path

import pandas as pd
from dvclive import Live

from lib.core.files import atomic_path, first_few, naming

log = logging.getLogger(__name__)


class Curves:
    """The metrics a run logs, step by step, into ``live_dir`` (dvclive's files: the plots and metrics.json).
    Only the main process writes; the others' calls do nothing."""

    def __init__(self, live_dir: str | Path, is_main: bool):
        self.live_dir, self.is_main, self.live = live_dir, is_main, None

    def open(self, resumed: bool):
        if self.is_main:
            self.live = Live(dir=str(self.live_dir), resume=resumed, report=None, save_dvc_exp=False,
                             dvcyaml=False)

    def log(self, step: int, **metrics):
        if not self.is_main:
            return
        self.live.step = step
        with naming(self.live_dir):  # dvclive writes a curve's line each time
            for name, value in metrics.items():
                self.live.log_metric(name, value)

    def summarise(self):
        """Write metrics.json, the latest value of each curve."""
        if self.is_main:
            with naming(self.live_dir):
                self.live.make_summary()

    def end(self):
        if self.is_main:
            with naming(self.live_dir):
                self.live.end()


def is_number(text: str) -> bool:
    """``text`` reads as a float, or is empty: how pandas writes a NaN back ("nan" and "inf" read too)."""
    try:
        float(text or "nan")
    except ValueError:
        return False
    return True


def truncate_curves(live_dir: str | Path, step: int):
    """Drop metric rows logged after ``step``: a killed run logged past its last checkpoint. A last line
    without its end is a write cut short (a full disk): dropped too, rather than read as a row ("20" of
    "201\t2.36" is step 20, its value missing). So, with a warning, are a row that is not a step and numbers and
    dvclive's summary, metrics.json, when it is not a JSON object: dvclive rewrites that file in place at every
    validation, so a full disk or a kill mid-write empties it. The next validation writes it again."""
    summary = Path(live_dir) / "metrics.json"
    try:
        readable = not summary.is_file() or isinstance(json.loads(summary.read_text(encoding="utf-8")), dict)
    except ValueError:  # not JSON, or not UTF-8
        readable = False
    if not readable:
        log.warning("%s: not a JSON object; dropped (the next validation writes it again)", summary)
        summary.unlink()
    for tsv in (Path(live_dir) / "plots" / "metrics").rglob("*.tsv"):
        text = tsv.read_text(encoding="utf-8", errors="replace")  # a byte that is no UTF-8: its row is dropped
        finished = text[:text.rfind("\n") + 1]
        if not finished:  # not even the header: dvclive writes it again with the next row
            tsv.unlink()
            continue
        header, *lines = finished[:-1].split("\n")
        columns = header.rstrip("\r").split("\t")  # step and the value; a timestamp first, when one is logged
        bad = {number for number, line in enumerate(lines, 2)  # the header is line 1
               if len(fields := line.rstrip("\r").split("\t")) != len(columns)
               or not fields[columns.index("step")].isdigit() or not all(map(is_number, fields))}
        if bad:
            log.warning("%s: dropped line%s %s: not a step and numbers", tsv, "s" * (len(bad) > 1),
                        first_few(map(str, sorted(bad))))
        rows = [line for number, line in enumerate(lines, 2) if number not in bad]
        frame = pd.read_csv(io.StringIO("\n".join([header, *rows, ""])), sep="\t")
        with atomic_path(tsv) as tmp:
            frame[frame["step"] <= step].to_csv(tmp, sep="\t", index=False)


# The dvclive metrics the report draws: every run logs the train/ ones; the others are per-task.
CURVES = ("train/loss", "train/grad_norm", "train/lr", "eval/train_loss", "valid/loss")


def read_curves(live_dir: Path, names: tuple[str, ...] = CURVES) -> dict[str, pd.DataFrame | None]:
    """Each of ``names`` as (step, value) rows; None for one that was not logged."""
    curves = dict.fromkeys(names)
    for name in names:
        path = live_dir / "plots" / "metrics" / f"{name}.tsv"
        if path.is_file():
            frame = pd.read_csv(path, sep="\t")
            curves[name] = frame.rename(columns={frame.columns[-1]: "value"})  # the metric's own name
    return curves

