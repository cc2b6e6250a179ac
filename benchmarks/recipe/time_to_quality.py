"""Multi30k's time to quality: the recipe before train.cooldown, Noam's rate alone ("today"), and
warmup-stable-decay (train.cooldown) with variants, trained in turn on one machine through DVC's experiment
queue; then a table of test BLEU against training minutes, each row's greedy BLEU tested against the first
row's by sacreBLEU's paired bootstrap resampling (1,000 resamples of the 1,000 test sentences).

    . .venv/bin/activate
    PYTHONPATH=. python benchmarks/recipe/time_to_quality.py queue --source ../shared/data/multi30k \\
        [--budget 19] [--rows today,wsd,wsd-budget,today-budget]
    dvc queue start            # one experiment at a time; `dvc queue status` until all are done
    PYTHONPATH=. python benchmarks/recipe/time_to_quality.py table [--rows today,wsd,...]

A row's experiment is named after it (`dvc exp show` lists them). --budget: the time budget of the *-budget rows,
in minutes: a third of what "today" takes on the machine stands for a CPU three times slower. "minutes to X" is
when the run's validation BLEU first reached the first row's final one (X); "-": never.
"""

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from lib.use.runs import Run, RunError

ROOT = Path(__file__).resolve().parents[2]

# Noam alone, stopped by patience or the budget: multi30k's default params before train.cooldown.
TODAY = {"epochs": 40, "time_budget_minutes": 55, "patience": 6, "average_last": 5, "max_tokens": 2048,
         "lr_factor": 0.6, "warmup": 800, "cooldown": 0.0, "model.dropout": 0.2}
# Warmup-stable-decay: the same warmup and peak, then the rate cooled to 0 over the last 40% of 7 epochs.
WSD = {**TODAY, "epochs": 7, "cooldown": 0.4, "patience": 0, "model.dropout": 0.1}
# WSD fitted to a short run: a warmup of under a sixth of the run (800 steps was half of wsd's), a higher peak
# (2.2e-3), a longer cooldown, half today's minutes. Post-LN did not learn at that peak (validation BLEU 3).
FAST = {**WSD, "epochs": 8, "time_budget_minutes": 27.5, "warmup": 200, "lr_factor": 0.5, "cooldown": 0.5}
# Today's recipe whose budget knows its end, multi30k's default now: the last 20% of the run (of the budget,
# where that comes first) cooled.
COOLED = {**TODAY, "cooldown": 0.2}
ROWS = {
    "today": TODAY,
    "today-budget": {**TODAY, "time_budget_minutes": "BUDGET"},
    "wsd": WSD,
    "wsd-budget": {**WSD, "time_budget_minutes": "BUDGET"},
    "wsd-epochs9": {**WSD, "epochs": 9},
    "wsd-warmup400": {**WSD, "warmup": 400},
    "wsd-cool0.2": {**WSD, "cooldown": 0.2},
    "wsd-tokens4096": {**WSD, "max_tokens": 4096},
    "fast": FAST,
    "today-cool0.2": COOLED,
    "today-cool0.2-budget": {**COOLED, "time_budget_minutes": "BUDGET"},
    "today-cooled-budget": {**TODAY, "cooldown": 0.4, "patience": 0, "time_budget_minutes": "BUDGET"},
}


def overrides(row: str, budget: float) -> list[str]:
    """The row's ``-S`` arguments for `dvc exp run`."""
    return [f"multi30k.train.{key}={budget if value == 'BUDGET' else value}" for key, value in ROWS[row].items()]


def queue(args):
    source = Path(args.source).expanduser().resolve()  # a queued run works in a copy of the repository
    for row in args.rows:
        sets = ["tasks=[multi30k]", f"multi30k.fetch.source={source}", *overrides(row, args.budget)]
        command = ["dvc", "exp", "run", "--queue", "-n", row, *[arg for s in sets for arg in ("-S", s)]]
        print(" ".join(command))
        subprocess.run(command, cwd=ROOT, check=True)


def run_of(row: str, given: dict[str, str]) -> Run:
    """The row's run: a directory laid out as the pipeline's (``--run ROW=DIR``, a run made by hand), or the
    experiment named after the row."""
    if row in given:
        return Run(row, Path(given[row]).resolve(), None)  # read as a workspace is
    return Run.named(row, ROOT)


def curve(run: Run, name: str) -> pd.Series:
    """A dvclive curve of the run as step -> value; empty when the run did not log it."""
    try:
        text = run.read(f"reports/multi30k/train/plots/metrics/{name}.tsv")
    except RunError:
        return pd.Series(dtype=float)
    frame = pd.read_csv(io.BytesIO(text), sep="\t")
    return frame.set_index("step")[frame.columns[-1]]


def run_row(run: Run) -> dict:
    """What the table shows of one run: its test outputs and metrics, and its validation BLEU by minutes."""
    metrics = run.json("reports/multi30k/metrics.json")
    samples = run.samples("multi30k")
    try:
        stop = run.json("reports/multi30k/train/stopped.json")
    except RunError:  # a run from before stopped.json
        stop = {}
    bleu, minutes, epochs = curve(run, "valid/bleu"), curve(run, "minutes"), curve(run, "epoch")
    if not len(minutes):  # a run from before the minutes curve: its total, at its last validation, from last.pt
        last = run.read("models/multi30k/checkpoints/last.pt")
        elapsed = torch.load(io.BytesIO(last), weights_only=True, map_location="cpu")["elapsed_s"]
        minutes = pd.Series({bleu.index[-1]: elapsed / 60})
    by_minutes = pd.DataFrame({"bleu": bleu, "minutes": minutes})
    beam = next(key for key in metrics if key.startswith("beam"))
    greedy = samples["greedy"].tolist()
    assert abs(BLEU().corpus_score(greedy, [samples["reference"].tolist()]).score - metrics["greedy"]["bleu"]) < 1e-9
    return {"metrics": metrics, "beam": beam, "greedy": greedy, "references": samples["reference"].tolist(),
            "valid": by_minutes, "final_valid": bleu.iloc[-1], "epochs": stop.get("epoch", int(epochs.iloc[-1])),
            "minutes": minutes.iloc[-1], "stopped": stop.get("param", "?")}


def minutes_to(valid: pd.DataFrame, target: float) -> str:
    """When the validation BLEU first reached ``target``: "-" never, "?" at a validation whose time the run did
    not log."""
    reached = valid[valid["bleu"] >= target]
    if not len(reached):
        return "-"
    return "?" if pd.isna(reached["minutes"].iloc[0]) else f"{reached['minutes'].iloc[0]:.1f}"


def table(args):
    given = dict(item.split("=", 1) for item in args.run)
    try:
        runs = {row: run_row(run_of(row, given)) for row in args.rows}
    except RunError as error:
        sys.exit(f"{error}: queue the row (`queue --rows ...`), then `dvc queue start`")
    first, base = args.rows[0], runs[args.rows[0]]
    target = base["final_valid"]
    systems = [(row, run["greedy"]) for row, run in runs.items()]
    _, results = PairedTest(systems, {"BLEU": BLEU()}, [base["references"]], test_type="bs")()
    tests = dict(zip(runs, results["BLEU"]))
    lines = [f"| row | overrides | stopped by | epochs | training minutes | minutes to valid BLEU {target:.2f} | "
             f"test greedy (95% CI) | p vs {first} | beam | chrF greedy |", "|" + "---|" * 10]
    for row, run in runs.items():
        m, result = run["metrics"], tests[row]
        p = "-" if row == first else f"{result.p_value:.4f}"
        changed = " ".join(arg.removeprefix("multi30k.train.") for arg in overrides(row, args.budget))
        lines.append(f"| {row} | `{changed}` | {run['stopped']} | {run['epochs']} | {run['minutes']:.1f} | "
                     f"{minutes_to(run['valid'], target)} | {m['greedy']['bleu']:.2f} ({result.mean:.2f} ± "
                     f"{result.ci:.2f}) | {p} | {m[run['beam']]['bleu']:.2f} | {m['greedy']['chrf']:.2f} |")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    q = commands.add_parser("queue", help="queue the rows' experiments")
    q.add_argument("--source", required=True, help="the Multi30k raw files (a local directory, or the URL)")
    t = commands.add_parser("table", help="the rows' results, the first row the baseline")
    t.add_argument("--run", action="append", default=[], metavar="ROW=DIR",
                   help="a row's run from a directory laid out as the pipeline's outputs, not an experiment")
    for sub in (q, t):
        sub.add_argument("--budget", type=float, default=19.0, help="the *-budget rows' time budget, in minutes")
        sub.add_argument("--rows", type=lambda text: text.split(","), default=["today", "wsd", "wsd-budget",
                                                                                "today-budget"])
    args = parser.parse_args()
    unknown = [row for row in args.rows if row not in ROWS]
    if unknown:
        parser.error(f"--rows: no row named {', '.join(unknown)} (rows: {', '.join(ROWS)})")
    {"queue": queue, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
