"""Compare runs: what each changed, what it bought, and whether the difference is real.

    python -m lib.use.compare                        # the workspace against the last commit (HEAD)
    python -m lib.use.compare main my-exp            # the first run is the base; each other is set against it
    python -m lib.use.compare --study studies/table3_multi30k.yaml   # a study's runs (lib.use.study) as a table

Runs are named as DVC names them: a commit, a branch or a tag, an experiment (`dvc exp list`), or
``workspace``. The page goes to reports/compare/ (index.md, index.html and figures/), which reports/index.html
links. For each task that the runs built, it shows:

- the params that differ from the base, as dotted keys (old -> new), and no other;
- the headline metrics and each difference; over the test sentences, whether it is real: paired bootstrap
  resampling (lib.use.significance) with a p-value and the difference's 95% interval;
- the curves overlaid: loss by step, the validation score by epoch and by training minutes;
- the test sentences whose outputs differ most, beside the reference.

It only reads the runs (lib.use.runs) and writes reports/compare/: it is no stage, so `dvc repro` never runs it.
"""

import argparse
import json
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from lib.core.config import flatten
from lib.core.files import atomic_dir
from lib.report.pages import headline, literal, literal_frame, markdown_html, page, shown_value
from lib.tasks import get_task
from lib.use import significance
from lib.use.compare_figures import curve_lines
from lib.use.runs import WORKSPACE, Run, RunError
from lib.use.study import Study, load_study

WRITES = ("index.md", "index.html", "figures")  # what the command writes in --out: anything else is refused
# train/metrics.json's facts, by the names the page (and a study's metrics.<name>) gives them
TRAINING = {"minutes": "minutes", "epoch": "epochs", "step": "steps"}
SPEED = "train/plots/metrics/train/tokens_per_s.tsv"  # dvclive's curve: its median, as the report gives it
EXTRA = ("loss", "valid_loss", "valid_perplexity", "parameters")  # metrics.json's, shown beside the headline
N_DIFFERING = 10  # test sentences shown, those whose score moved most


@dataclass
class Built:
    """What one run holds of a task: its metrics, curves, and (while in the cache) its test outputs."""

    run: Run
    metrics: dict  # flat: metrics.json's keys, and the training facts under TRAINING's names
    losses: pd.DataFrame | None
    scores: pd.DataFrame | None
    samples: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)  # what could not be read, and how to bring it back


def markdown_table(frame: pd.DataFrame) -> str:
    """``frame`` as a Markdown table, its header and every text cell shown as written (``literal``)."""
    return literal_frame(frame).rename(columns=literal).to_markdown(index=False)


def optional(read, notes: list[str]):
    try:
        return read()
    except RunError as error:
        notes.append(str(error))
        return None


def built(run: Run, task: str) -> Built | None:
    """The run's outputs of ``task``; None where it has no metrics of it (the task was not built)."""
    notes: list[str] = []
    metrics = optional(lambda: run.json(f"reports/{task}/metrics.json"), notes)
    if metrics is None:
        return None
    flat = flatten(metrics)
    train = optional(lambda: flatten(run.json(f"reports/{task}/train/metrics.json")), notes) or {}
    flat.update({name: train[key] for key, name in TRAINING.items() if key in train})
    if (speed := optional(lambda: run.csv(f"reports/{task}/{SPEED}", sep="\t"), [])) is not None:
        flat["tokens_per_s"] = float(speed.iloc[:, -1].median())  # the last step's rate alone is noise
    return Built(run, flat, optional(lambda: run.csv(f"reports/{task}/losses.csv"), notes),
                 optional(lambda: run.csv(f"reports/{task}/valid_score.csv"), notes),
                 optional(lambda: run.samples(task), notes), notes)


def shown_metrics(task: str, metrics: dict) -> list[str]:
    """The metric keys the page shows for ``task``: its headline, the losses and size, then the training's."""
    keys = list(headline(get_task(task).headline, metrics))
    keys += [key for key in EXTRA if key in metrics and key not in keys]
    return keys + [name for name in (*TRAINING.values(), "tokens_per_s") if name in metrics]


def setting(value) -> str:
    """A param's value as the params file writes it; a key a run's file lacks (its default applies): unset."""
    return "(unset)" if value is None else literal(json.dumps(value) if not isinstance(value, str) else value)


def differing_params(base: Run, run: Run, task: str) -> list[tuple[str, object, object]]:
    """(key, base's value, run's value) for each of the task's params that differ; ``None``: not set."""
    old, new = base.task_params(task), run.task_params(task)
    return [(key, old.get(key), new.get(key)) for key in sorted(old.keys() | new.keys())
            if old.get(key) != new.get(key)]


def tests(task: str, base: Built, new: Built, only: str | None = None) -> tuple[dict, str]:
    """The paired tests (significance.Difference) of the metrics that the two runs' test outputs support
    (``only``: of that one), by metric key; and, where there are none, why."""
    if base.samples is None or new.samples is None:
        return {}, "no test: a run's test outputs are not at hand (see the notes)"
    a, b = base.samples, new.samples
    if "reference" not in a or "reference" not in b:
        return {}, "no test: an LM scores its validation text as one sequence, with no per-example scores"
    if len(a) != len(b) or a["reference"].tolist() != b["reference"].tolist():
        return {}, "no test: the runs' test sets differ (another data or tokenizer param)"
    references, found = a["reference"].tolist(), {}
    keys = [key for key in shown_metrics(task, base.metrics) if only in (None, key)]
    for key in keys:
        search, _, name = key.partition(".")
        if name in ("bleu", "chrf") and search in a and search in b:
            test = significance.bleu_test if name == "bleu" else significance.chrf_test
            found[key] = test(a[search].tolist(), b[search].tolist(), references)
        elif name == "exact_match" and search == "greedy":
            found[key] = significance.mean_test(a["correct"], b["correct"])
    if "loss" in keys and "reference_nll" in a and "reference_nll" in b:
        found["loss"] = significance.ratio_test(a["reference_nll"], a["reference_tokens"], b["reference_nll"],
                                                b["reference_tokens"])
    return found, "" if found else "no test: the runs' outputs hold no per-sentence scores"


def interval(test: significance.Difference) -> str:
    return f"[{test.low:+.4g}, {test.high:+.4g}]"


def p_value(test: significance.Difference) -> str:
    return f"{test.p_value:.4f}" + (" **(real)**" if test.significant() else "")


def difference_cells(base, new, test: significance.Difference | None) -> list[str]:
    if not isinstance(base, (int, float)) or not isinstance(new, (int, float)):
        return ["", "", ""]
    return [f"{new - base:+.4g}", *(("", "") if test is None else (interval(test), p_value(test)))]


def metrics_table(task: str, base: Built, new: Built) -> list[str]:
    found, why = tests(task, base, new)
    rows = []
    for key in shown_metrics(task, base.metrics):
        old, value = base.metrics.get(key), new.metrics.get(key)
        rows.append([key, shown_value(old) if old is not None else "-", shown_value(value) if value is not None
                     else "-", *difference_cells(old, value, found.get(key))])
    frame = pd.DataFrame(rows, columns=["metric", base.run.name, new.run.name, "difference", "95% interval", "p"])
    lines = [markdown_table(frame), ""]
    if found:
        lines += [f"Paired bootstrap resampling over the {len(base.samples)} test sentences ({significance.RESAMPLES} "
                  "resamples, as sacreBLEU's paired_bs): p is the chance of a difference this large if the runs were "
                  "equal; **(real)**: p < 0.05. `loss` is the test loss (nats per token).", ""]
    else:
        lines += [why + ".", ""]
    return lines


def differing_sentences(base: Built, new: Built, n: int = N_DIFFERING) -> list[str]:
    """The test sentences whose greedy outputs differ, those whose sentence score moved most first."""
    if base.samples is None or new.samples is None or len(base.samples) != len(new.samples) \
            or "reference" not in base.samples:
        return []
    a, b = base.samples, new.samples
    changed = a["greedy"] != b["greedy"]
    if not changed.any():
        return ["Every test output is the same.", ""]
    moved = (b["score"] - a["score"])[changed].abs().sort_values(ascending=False, kind="stable").index[:n]
    frame = pd.DataFrame({"source": a.loc[moved, "source"], "reference": a.loc[moved, "reference"],
                          base.run.name: a.loc[moved, "greedy"], new.run.name: b.loc[moved, "greedy"],
                          f"{base.run.name}'s score": a.loc[moved, "score"].round(2),
                          f"{new.run.name}'s score": b.loc[moved, "score"].round(2)})
    return [f"{changed.sum()} of {len(a)} test outputs differ (greedy); the {len(moved)} whose sentence score moved "
            "most:", "", markdown_table(frame), ""]


def notes_lines(runs: dict[str, Built]) -> list[str]:
    notes = [f"- {literal(note)}" for b in runs.values() for note in b.notes]
    return ["Not at hand:", "", *notes, ""] if notes else []


def task_lines(task: str, runs: list[Run], figures: Path) -> list[str]:
    found = {run.name: built(run, task) for run in runs}
    lines = [f"## {task}", ""]
    if missing := [name for name, b in found.items() if b is None]:
        return lines + [f"Not built in {', '.join(map(literal, missing))}: no metrics of {task}.", ""]
    base = found[runs[0].name]
    for run in runs[1:]:
        new = found[run.name]
        lines += [f"### {literal(run.name)} against {literal(base.run.name)}", "", "Params that differ:", ""]
        changed = differing_params(base.run, run, task)
        lines += [f"- `{key}`: {setting(old)} -> {setting(value)}" for key, old, value in changed] or ["- none"]
        lines += ["", *metrics_table(task, base, new), *differing_sentences(base, new)]
    lines += ["### Curves", "", *curve_lines(task, found, figures), *notes_lines(found)]
    return lines


def compare_lines(runs: list[Run], figures: Path) -> list[str]:
    tasks = [task for task in runs[0].tasks if all(task in run.tasks for run in runs[1:])]
    names = ", ".join(literal(run.name) + (f" ({run.rev[:8]})" if run.rev else "") for run in runs)
    lines = ["# Comparison", "", f"Runs: {names}. The first is the base.", ""]
    if not tasks:
        return lines + ["The runs have no task in common (params.yaml: tasks).", ""]
    for task in tasks:
        lines += task_lines(task, runs, figures)
    return lines


def row_lines(study: Study) -> list[str]:
    """What each row changes: its own overrides, beside those the study's ``set`` gives every row."""
    def settings(overrides: dict) -> str:
        return ", ".join(f"`{key}`: {setting(value)}" for key, value in overrides.items()) or "none"

    return [f"Each row's own params (every row also sets {settings(study.set)}):", "",
            *[f"- {literal(row)}: {settings(own)}" for row, own in study.rows.items()], ""]


def study_lines(study: Study, root: Path, figures: Path) -> list[str]:
    """The study as a table: one row a run, the study's columns, and each row's test against the first row.
    Rows not run yet are named below it; the first row must have run."""
    runs, found = {}, {}
    for row in study.rows:
        try:
            runs[row] = Run.named(study.experiment(row), root)
        except RunError:  # no such experiment yet
            continue
        if (outputs := built(runs[row], study.task)) is not None:
            found[row] = outputs
    base_row = next(iter(study.rows))
    if base_row not in found:
        raise RunError(f"{study.name}: its first row, {study.experiment(base_row)}, has no results yet (`dvc queue "
                       "status`), and every row is tested against it")
    base, key = found[base_row], study.test
    table = []
    for row, b in found.items():
        values = {label: study.value(column, runs[row], b.metrics) for label, column in study.columns.items()}
        if key and row != base_row:
            test = tests(study.task, base, b, only=key)[0].get(key)
            values[f"{key} vs {base_row}"] = "" if test is None else f"{test.delta:+.4g} {interval(test)}"
            values["p"] = "" if test is None else p_value(test)
        table.append({"row": row, **values})
    frame = pd.DataFrame(table).fillna("")
    lines = [f"# Study: {literal(study.name)}", "", literal(study.description), "",
             markdown_table(frame), ""]
    if key:
        lines += [f"Each row's `{key}` against row `{base_row}`: the difference with its 95% interval and p, by paired "
                  "bootstrap resampling over the test sentences; **(real)**: p < 0.05.", ""]
    lines += row_lines(study)
    if missing := [row for row in study.rows if row not in found]:
        lines += [f"Not run yet: {', '.join(missing)} (`dvc queue status`; `python -m lib.use.study <file> --rows "
                  f"{','.join(missing)}` queues them).", ""]
    by_name = {runs[row].name: b for row, b in found.items()}
    return lines + ["## Curves", "", *curve_lines(study.task, by_name, figures), *notes_lines(by_name)]


def write_page(title: str, out: Path, page_lines):
    """index.md and index.html in ``out``, replaced whole: ``page_lines(figures)``, the page's Markdown, draws
    the figures it links into ``figures``."""
    with atomic_dir(out, WRITES, "python -m lib.use.compare") as tmp:
        figures = tmp / "figures"
        figures.mkdir()
        text = "\n".join(page_lines(figures)) + "\n"
        (tmp / "index.md").write_text(text)
        (tmp / "index.html").write_text(page(title, f"<main>\n{markdown_html(text)}\n</main>"))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lib.use.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help=f"a commit, branch, tag, experiment or {WORKSPACE!r}; the first is the base "
                             f"(default: HEAD {WORKSPACE})")
    parser.add_argument("--study", type=Path, help="a study file (studies/*.yaml): its runs as a table")
    parser.add_argument("--out", type=Path, default=Path("reports/compare"), help="default: reports/compare")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the repository (default: here)")
    args = parser.parse_args(argv)
    root = args.repo.resolve()
    try:
        if args.study:
            if args.runs:
                parser.error("name runs or --study, not both")
            study = load_study(args.study)
            title, lines = f"Study: {study.name}", partial(study_lines, study, root)
        else:
            names = args.runs or ["HEAD", WORKSPACE]
            if len(names) < 2:
                parser.error("name two runs or more (the first is the base), or none: HEAD against the workspace")
            runs = [Run.named(name, root) for name in names]
            title, lines = "Comparison", partial(compare_lines, runs)
        write_page(title, args.out, lines)
    except (RunError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {args.out / 'index.html'} and {args.out / 'index.md'}")


if __name__ == "__main__":
    main()
