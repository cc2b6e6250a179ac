"""The comparison page's figures: each run's curves overlaid, one colour a run (files only)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402 - after matplotlib.use: the backend is set before pyplot loads
import pandas as pd  # noqa: E402 - after matplotlib.use: the backend is set before pyplot loads

from lib.tasks import get_task  # noqa: E402 - after matplotlib.use: the backend is set before pyplot loads


def save(fig, out: Path):
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_losses(losses: dict[str, pd.DataFrame], out: Path):
    """Each run's training loss (a running mean, solid) and validation loss (dashed, dots) by step, from its
    losses.csv (step, split, loss)."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (run, frame) in enumerate(losses.items()):
        colour = f"C{i}"
        train = frame[frame["split"] == "train"]
        window = max(1, len(train) // 100)
        ax.plot(train["step"], train["loss"].rolling(window, min_periods=1).mean(), color=colour,
                label=f"{run}: train")
        valid = frame[frame["split"] == "valid"]
        if len(valid):
            ax.plot(valid["step"], valid["loss"], "o--", color=colour, markersize=3, label=f"{run}: validation")
    ax.set(xlabel="step", ylabel="loss (nats per token)", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, out)


def plot_scores(scores: dict[str, pd.DataFrame], name: str, x: str, out: Path):
    """Each run's validation score ``name`` against ``x`` (epoch or minutes), from its valid_score.csv."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (run, frame) in enumerate(scores.items()):
        ax.plot(frame[x], frame[name], "o-", color=f"C{i}", markersize=3, label=run)
    shown = "training minutes" if x == "minutes" else x
    ax.set(xlabel=shown, ylabel=f"validation {name.replace('_', ' ')}",
           title=f"Validation {name.replace('_', ' ')} by {shown}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, out)


def curve_lines(task: str, runs: dict, figures: Path) -> list[str]:
    """The page's lines that show the runs' curves overlaid (``runs``: lib.use.compare.Built by run name),
    drawn into ``figures``: loss by step, the validation score by epoch and by training minutes."""
    lines = []
    losses = {name: b.losses for name, b in runs.items() if b.losses is not None}
    if losses:
        plot_losses(losses, figures / f"{task}-loss.png")
        lines += [f"![{task}: loss by step](figures/{task}-loss.png)", ""]
    name = get_task(task).valid_metric or "loss"
    scores = {run: b.scores for run, b in runs.items() if b.scores is not None and name in b.scores and len(b.scores)}
    for x in ("epoch", "minutes"):
        drawn = {run: frame for run, frame in scores.items() if x in frame and frame[x].notna().any()}
        if drawn:
            plot_scores(drawn, name, x, figures / f"{task}-{name}-by-{x}.png")
            lines += [f"![{task}: validation {name} by {x}](figures/{task}-{name}-by-{x}.png)", ""]
    return lines
