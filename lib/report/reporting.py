"""The report stage: reports/<task>/report.md with metrics, curves, attention heatmaps and samples.

Attention weights come from the model's own forward (returned, not stashed),
on the CPU, from the trained weights: nothing is retrained.
"""

import io
import json
import logging
from pathlib import Path
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd

from lib.model import checkpoint
from lib.core import files
from lib.report.captions import (curves_caption, model_line, model_section, stalled_caption, stop_caption,
                                 validation_caption)
from lib.core.config import flatten
from lib.train.curves import CURVES, read_curves
from lib.report.figures import (plot_losses, plot_valid_score)
from lib.core.files import not_as_written
from lib.report.pages import card_html, headline, report_html, shown_value
from lib.report.families import REPORTING
from lib.tasks import get_task
from lib.tasks.base import Task
from lib.tasks.outputs import HOLDS
from transformer.loss import smoothed_loss_floor

log = logging.getLogger(__name__)


def metrics_table(metrics: dict) -> str:
    """Every scalar metric; the searches (greedy, beam) side by side; a per-length breakdown (by_length,
    bleu_by_length) has its own plot."""
    searches = {k: v for k, v in metrics.items() if isinstance(v, dict) and (k == "greedy" or k.startswith("beam"))}
    flat = flatten({k: v for k, v in metrics.items() if not k.endswith("by_length") and k not in searches})
    table = pd.DataFrame({"metric": list(flat), "value": [shown_value(v) for v in flat.values()]})
    lines = [table.to_markdown(index=False, colalign=("left", "right"), disable_numparse=True)]
    if searches:
        first = next(iter(searches.values()))
        # Every search's scores, in first-seen order: beam search adds its length penalty (alpha).
        names = list(dict.fromkeys(k for scores in searches.values() for k in scores if not k.endswith("signature")))
        side = pd.DataFrame({"metric": names, **{search: [shown_value(scores.get(name, "")) for name in names]
                                                for search, scores in searches.items()}})
        lines += ["", "Decoding (seconds: the whole test set, on evaluate.device):", "",
                  side.to_markdown(index=False, disable_numparse=True)]
        signatures = {k: v for k, v in first.items() if k.endswith("signature")}
        lines += [""] + [f"- {name.replace('_', ' ')}: `{value}`" for name, value in signatures.items()]
        if "search_errors" in first:
            lines += ["- search errors: wrong outputs that the model scores below the reference, which it "
                      "prefers but the search missed; model errors: wrong outputs it scores at least as high as "
                      "the reference, its own preference. Greedy search is judged by the outputs' probability, "
                      "beam search by the length-penalised score it ranks by (`lib.use.generate --score` scores "
                      "any output)."]
    return "\n".join(lines)


def evaluate_text(path: Path) -> str:
    """An evaluate output's text, read whole: a byte that is not UTF-8 is named by its offset in the file."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise not_as_written(path, f"not UTF-8 text at byte {err.start}", "evaluate") from None


def read_metrics(path: str | Path) -> dict:
    """The evaluate stage's metrics.json: a JSON object."""
    path = Path(path)
    try:
        metrics = json.loads(evaluate_text(path))
    except json.JSONDecodeError as err:
        where = f"line {err.lineno}, column {err.colno}"
        raise not_as_written(path, f"not JSON at {where} ({err.msg})", "evaluate") from None
    if not isinstance(metrics, dict):
        raise not_as_written(path, f"a JSON {type(metrics).__name__}, where the metrics are an object", "evaluate")
    return metrics


def read_samples(path: str | Path, keys: tuple[str, ...]) -> pd.DataFrame:
    """The evaluate stage's samples.jsonl: a JSON object a line (blank lines aside), at least one, each with
    ``keys`` (its model family's)."""
    path, rows = Path(path), []
    # split at "\n", not splitlines: a text may hold U+2028 as it is
    for number, line in enumerate(evaluate_text(path).split("\n"), 1):
        if not line.strip():  # the last newline's empty rest, or a blank line: no sample
            continue
        try:
            rows.append(row := json.loads(line))
        except json.JSONDecodeError as err:
            raise not_as_written(path, f"line {number}: not JSON ({err.msg})", "evaluate") from None
        if not isinstance(row, dict) or (missing := [k for k in keys if k not in row]):
            found = f"no {missing[0]!r}" if isinstance(row, dict) else f"a JSON {type(row).__name__}"
            raise not_as_written(path, f"line {number}: {found}, where a sample has {', '.join(keys)}", "evaluate")
    if not rows:
        raise not_as_written(path, "no samples", "evaluate")
    return pd.DataFrame(rows)


def read_lengths(path: str | Path) -> pd.DataFrame:
    """The evaluate stage's by_length.csv: a ``length`` column and the task's score by it, one row or more."""
    path = Path(path)
    try:
        frame = pd.read_csv(io.StringIO(evaluate_text(path)))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise not_as_written(path, f"not a CSV table ({str(err).strip()})", "evaluate") from None
    if "length" not in frame.columns or frame.empty or len(frame.columns) < 2:
        raise not_as_written(path, f"columns {list(frame.columns)} and {len(frame)} rows, where the score by "
                             "length has a length column, a score and a row or more", "evaluate")
    return frame


def losses_table(curves: dict) -> pd.DataFrame:
    """losses.csv, the loss curves `dvc plots` overlays (step, split, loss): validation's every point, and the
    training loss as the report draws it, a running mean over ~1% of the run, at 500 steps at most."""
    train = curves["train/loss"]
    window = max(1, len(train) // 100)
    smooth = train.assign(value=train["value"].rolling(window, min_periods=1).mean())
    smooth = smooth.iloc[::max(1, -(-len(smooth) // 500))]
    parts = [smooth.assign(split="train")]
    if curves["valid/loss"] is not None:
        parts.append(curves["valid/loss"].assign(split="valid"))
    return pd.concat(parts)[["step", "split", "value"]].rename(columns={"value": "loss"})


@dataclass(frozen=True)
class ReportPaths:
    """What the report stage reads and writes, named by the --option dvc.yaml passes each as. page, card and
    scores default to report.html, card.html and valid_score.csv beside ``out`` (report.md)."""

    data: Path  # the prepared splits
    tokenizer: Path
    model: Path  # model.pt
    metrics: Path  # the evaluate stage's metrics.json, samples.jsonl and by_length.csv
    samples: Path
    lengths: Path
    live: Path  # the train stage's curves
    out: Path  # report.md
    figures: Path  # a directory, written whole
    losses: Path  # losses.csv
    page: Path | None = None
    card: Path | None = None
    scores: Path | None = None


def run(task, cfg, paths: ReportPaths):
    """Draw the figures into a fresh directory and write report.md, report.html, card.html, losses.csv and
    valid_score.csv beside their places; then all go into place together: an error or Ctrl-C half way (a full
    disk writing report.md too) leaves the previous report and its figures as they were, and a report with fewer
    figures than the last leaves none of the last's behind."""
    report_path, figures_dir = Path(paths.out), Path(paths.figures)
    page_path = Path(paths.page or report_path.with_suffix(".html"))
    card_path = paths.card or report_path.parent / "card.html"
    scores_path = paths.scores or report_path.parent / "valid_score.csv"
    rel = figures_dir.relative_to(report_path.parent)
    if page_path.parent.resolve() != report_path.parent.resolve():
        raise ValueError(f"--page {page_path}: not beside --out {report_path}, whose figures it shows")
    with files.atomic_dir(figures_dir, HOLDS["report", "figures"], "the report stage") as drawing:
        report = report_lines(task, cfg, paths, drawing, rel)
        markdown = "\n".join(report.lines)
        before, after = "\n".join(report.lines[:report.view_at]), "\n".join(report.lines[report.view_at:])
        card = card_html(task, report.summary, headline(get_task(task).headline, report.metrics))
        files.written_together([
            (paths.losses, lambda tmp: losses_table(read_curves(Path(paths.live))).to_csv(tmp, index=False)),
            (scores_path, lambda tmp: report.scores.to_csv(tmp, index=False)),
            (report_path, lambda tmp: tmp.write_text(markdown)),
            (page_path, lambda tmp: tmp.write_text(report_html(f"{task}: report", before, after, report.view))),
            (card_path, lambda tmp: tmp.write_text(card))])


class Report(NamedTuple):
    lines: list[str]  # report.md's
    view_at: int  # where report.html puts its attention view
    view: dict  # that view's data
    metrics: dict
    scores: pd.DataFrame  # valid_score.csv
    summary: str  # what model.pt holds, in a line


def valid_score_table(live_dir: Path, chosen: Task) -> pd.DataFrame:
    """valid_score.csv, the plot of the validation score (step, [epoch,] [minutes,] score): the task's
    ``valid_metric`` logged after each epoch (a translation task), or the validation loss (an LM), with the
    training minutes spent by then where the run logged them. No rows: none was logged (train.valid_score
    false). The score is the last column, the one `dvc plots` draws."""
    name = chosen.valid_metric or "loss"
    curves = read_curves(live_dir, (f"valid/{name}", "epoch", "minutes"))
    curve = curves[f"valid/{name}"]
    if curve is None:
        return pd.DataFrame(columns=["step", name])
    table = curve[["step", "value"]].rename(columns={"value": name})
    if curves["epoch"] is not None:
        epochs = curves["epoch"][["step", "value"]].rename(columns={"value": "epoch"})
        table = table.merge(epochs, on="step", how="left")[["step", "epoch", name]]
        # A validation inside an epoch (max_steps, a cooled time budget) at its share of the epochs' steps
        complete = table.dropna(subset=["epoch"])
        if len(complete):
            inside = table["epoch"].isna()
            per_epoch = complete["step"].iloc[-1] / complete["epoch"].iloc[-1]
            table.loc[inside, "epoch"] = (table.loc[inside, "step"] / per_epoch).round(2)
    if curves["minutes"] is not None:
        minutes = curves["minutes"][["step", "value"]].rename(columns={"value": "minutes"})
        table = table.merge(minutes, on="step", how="left")
        table = table[[column for column in table.columns if column != name] + [name]]
    return table


def report_lines(task, cfg, paths: ReportPaths, figures_dir: Path, rel: Path) -> Report:
    """report.md's lines, drawing its figures into ``figures_dir``, which the report links as ``rel``, and the
    attention view of report.html."""
    data_dir, live_dir = paths.data, Path(paths.live)
    chosen = get_task(task)
    family = REPORTING[chosen.family]
    metrics, samples = read_metrics(paths.metrics), read_samples(paths.samples, family.sample_keys)
    by_length = read_lengths(paths.lengths)
    model, tokenizers, state = checkpoint.load_trained(paths.model, paths.tokenizer, task=task)
    family.check(cfg, state)  # before anything is drawn

    smoothing = state.get("label_smoothing", 0.0)  # seq2seq models; an LM trains without
    floor = smoothed_loss_floor(state["tgt_vocab_size"], smoothing)
    curves = read_curves(live_dir)
    unlogged = [name for name in CURVES if name.startswith("train/") and curves[name] is None]
    if unlogged:  # every run logs these: --live names some other directory
        raise FileNotFoundError(f"{live_dir / 'plots' / 'metrics' / unlogged[0]}.tsv: training curve not found "
                                "(run the train stage first)")
    plot_losses(curves, figures_dir / "loss.png", floor)
    first_loss = curves["train/loss"]["value"].iloc[0]
    validation = validation_caption(curves["valid/loss"], chosen.family)
    stalled = stalled_caption(curves["train/loss"], curves["train/lr"], state["tgt_vocab_size"], chosen.family)
    stopped = stop_caption(live_dir)
    lines = [
        f"# {task}: report", "",
        model_line(state), "",
        *model_section(model, state, live_dir),
        "## Metrics", "", metrics_table(metrics), "",
        *family.data_sections(data_dir, state, metrics),
        "## Training curves", "", f"![loss curves, gradient norm and learning rate]({rel}/loss.png)", "",
        curves_caption(first_loss, state["tgt_vocab_size"], smoothing, floor, state.get("initial_repeats_input"),
                       model.cfg.tie_embeddings), "",
        *([stalled, ""] if stalled else []),
        *([validation, ""] if validation else []),
        *([stopped, ""] if stopped else []),
    ]
    scores = valid_score_table(live_dir, chosen)
    if "epoch" in scores.columns and len(scores):
        plot_valid_score(scores, chosen.valid_metric, figures_dir / "valid_score.png")
        best = scores.loc[scores[chosen.valid_metric].idxmax()]
        when = f"after epoch {best['epoch']:g}" if pd.notna(best["epoch"]) else f"at step {int(best['step'])}"
        lines += ["## Validation score by epoch", "",
                  f"The task's score of the greedy outputs of the validation split after each epoch ("
                  f"{chosen.valid_metric}; train.valid_score), best {best[chosen.valid_metric]:.4f} {when}. It "
                  "can keep rising after the validation loss stops falling.", "",
                  f"![validation score by epoch]({rel}/valid_score.png)", ""]
    view_at = len(lines)
    lines += family.sections(chosen, cfg, data_dir, tokenizers, model, metrics, samples, by_length, figures_dir,
                             rel, state)
    view = family.view(cfg, data_dir, tokenizers, model, samples)
    return Report(lines, view_at, view, metrics, scores, model_line(state))
