"""The figures of the report and of ``python -m lib.use.generate --attention``: loss curves, attention heatmaps
(from the model's own forward: weights returned, not stashed), accuracy and BLEU by length. Files only."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402 - after matplotlib.use: the backend is set before pyplot loads
import pandas as pd  # noqa: E402 - after matplotlib.use: the backend is set before pyplot loads
import torch  # noqa: E402 - after matplotlib.use: the backend is set before pyplot loads

from lib.report.attention_maps import token_strings  # noqa: E402 - after matplotlib.use: the backend is set before pyplot loads


def plot_losses(curves: dict[str, pd.DataFrame | None], out: Path, floor: float = 0.0):
    """Training and validation loss (left), the gradient norm (middle) and the learning-rate schedule
    (right), from ``read_curves``: where a loss will not fall, the other two usually say why. ``floor``:
    the least loss label smoothing lets the training loss reach (0: none), drawn dashed."""
    fig, (ax, ax_grad, ax_lr) = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [3, 2, 2]})
    train = curves["train/loss"]
    # Per-step values are noisy: show a running mean over ~1% of the run.
    window = max(1, len(train) // 100)
    ax.plot(train["step"], train["value"].rolling(window, min_periods=1).mean(), label="train (per step)")
    for name, label in (("eval/train_loss", "train (fixed batches)"), ("valid/loss", "validation")):
        curve = curves[name]
        if curve is not None:
            ax.plot(curve["step"], curve["value"], "o-", markersize=3, label=label)
    if floor > 0:
        ax.axhline(floor, color="tab:blue", linestyle="--", linewidth=1,
                   label=f"label-smoothing floor of the training loss ({floor:.2f})")
    ax.set(xlabel="step", ylabel="loss (nats per token)", yscale="log", title="Training and validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    grad = curves["train/grad_norm"]
    ax_grad.plot(grad["step"], grad["value"], color="tab:gray", alpha=0.3, linewidth=0.5, label="per step")
    ax_grad.plot(grad["step"], grad["value"].rolling(window, min_periods=1).mean(), color="tab:green",
                 label="running mean")
    ax_grad.set(xlabel="step", ylabel="global L2 norm", yscale="log",
                title="Gradient norm, before clipping to train.clip_norm")
    ax_grad.grid(alpha=0.3)
    ax_grad.legend()
    lr = curves["train/lr"]
    ax_lr.plot(lr["step"], lr["value"], color="tab:purple")
    ax_lr.set(xlabel="step", ylabel="learning rate", title="Learning-rate schedule")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# What a heatmap's rows (the queries: the positions reading) and columns (the keys: the tokens read) are.
LM_AXES = ("position, labelled by its token (it predicts the next)", "token read")


def plot_attention_grid(weights: list[torch.Tensor], rows: list[str], cols: list[str], title: str, out: Path,
                        red_rows: frozenset[int] = frozenset(), axes: tuple[str, str] = LM_AXES):
    """One heatmap per (layer, head): weights[layer] is (H, len(rows), len(cols)); a row of panels per layer, a
    column per head, one colour scale. ``axes``: what the rows and the columns are; the labels of ``red_rows``
    are drawn in red."""
    L, H = len(weights), weights[0].size(0)
    n = max(len(rows), len(cols))
    cell = min(4.0, max(2.2, 0.11 * n))  # inches per panel: room for every label, not a poster
    font = 6 if n <= 32 else 4.5
    # Every panel has the same tokens: the left column and the bottom row carry them; the heads are named above
    # the top row and the layers beside the left column, where no tick label reaches.
    fig, grid = plt.subplots(L, H, figsize=(cell * H + 1.8, cell * L + 1.2), squeeze=False, sharex=True,
                             sharey=True, layout="constrained")
    for layer, layer_weights in enumerate(weights):
        for head in range(H):
            ax = grid[layer][head]
            image = ax.imshow(layer_weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            if layer == 0:
                ax.set_title(f"head {head + 1}", fontsize=9)
            if head == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=9)
    grid[0][0].set_xticks(range(len(cols)), cols)
    grid[0][0].set_yticks(range(len(rows)), rows)
    for ax in grid.flat:
        ax.tick_params(labelsize=font, labelbottom=ax in grid[-1], labelleft=ax in grid[:, 0])
        ax.tick_params(axis="x", labelrotation=90)
        for row, label in enumerate(ax.get_yticklabels()):
            if row in red_rows:
                label.set_color("tab:red")
    fig.colorbar(image, ax=grid, shrink=min(1.0, 0.5 + 0.25 * L), label="attention weight")
    fig.supylabel(f"rows: {axes[0]}", fontsize=9)
    fig.supxlabel(f"columns: {axes[1]}", fontsize=9)
    fig.suptitle(title, fontsize=11)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # long sub-word labels are never clipped
    plt.close(fig)


SEQ2SEQ_AXES = {
    "encoder self-attention": ("source position, labelled by its token", "source token read"),
    "decoder self-attention": ("output position, labelled by the token it predicts",
                               "decoder input read (<bos>, then the output so far)"),
    "cross-attention": ("output position, labelled by the token it predicts", "source token read"),
}


def example_heatmaps(maps, i: int, src: list[str], tgt_in: list[str], predicted: list[str], title: str,
                     stem: str, figures_dir: Path, rel: Path, red_rows: frozenset[int] = frozenset()) -> list[str]:
    """Example i of a batch: one figure per kind of attention, cut to its real lengths; the report's
    lines linking them. Decoder rows are labelled by ``predicted``; ``red_rows`` of them in red."""
    S, T = len(src), len(tgt_in)
    shapes = {"encoder self-attention": ("encoder_self", S, S, src, src, frozenset()),
              "decoder self-attention": ("decoder_self", T, T, predicted, tgt_in, red_rows),
              "cross-attention": ("cross", T, S, predicted, src, red_rows)}
    lines = []
    for kind, (prefix, rows, cols, row_labels, col_labels, red) in shapes.items():
        name = f"{prefix}_attention_{stem}.png"
        weights = [w[i, :, :rows, :cols] for w in maps[kind]]
        plot_attention_grid(weights, row_labels, col_labels, f"{kind.capitalize()}, {title}", figures_dir / name,
                            red, SEQ2SEQ_AXES[kind])
        lines += [f"![{kind}, {title}]({rel}/{name})", ""]
    return lines


def pair_heatmaps(maps, batch, pairs, i: int, tokenizers, title: str, stem: str, figures_dir: Path, rel: Path,
                  predicted: torch.Tensor | None = None, red_rows: frozenset[int] = frozenset()) -> list[str]:
    """``example_heatmaps`` of pair i of a teacher-forced ``batch`` (collated from ``pairs``), cut to the
    pair's real lengths; decoder rows labelled by ``predicted`` (T,), by default the target's own tokens."""
    S, T = len(pairs.src[i]), len(pairs.tgt[i]) + 1  # the real lengths (the target with its eos), no padding
    predicted = batch.tgt_out[i, :T] if predicted is None else predicted
    return example_heatmaps(maps, i, token_strings(tokenizers.source, batch.src[i, :S].cpu()),
                            token_strings(tokenizers.target, batch.tgt_in[i, :T].cpu()),
                            token_strings(tokenizers.target, predicted.cpu()), title, stem, figures_dir, rel, red_rows)


def plot_by_length(shares: dict[int, float], trained: tuple[int, int], out: Path):
    """Exact match by length ({1: share, ...}), the trained lengths shaded."""
    lengths = list(shares)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(lengths, [shares[n] for n in lengths], "o-")
    ax.axvspan(trained[0] - 0.5, trained[1] + 0.5, color="tab:green", alpha=0.12, label="lengths seen in training")
    ax.legend(loc="center right")
    ax.set(xlabel="sequence length (tokens)", ylabel="exact-sequence match", ylim=(-0.02, 1.02),
           title="Accuracy by length", xticks=lengths)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_accuracy_by_value(table: pd.DataFrame, out: Path):
    """Token accuracy by target value (left, each point's area its test tokens) and against how often that
    value occurs in training (right, log scale): columns value, tokens, accuracy, train_count."""
    fig, (ax, ax_seen) = plt.subplots(1, 2, figsize=(12, 3.8))
    size = 8 + 60 * table["tokens"] / table["tokens"].max()
    ax.scatter(table["value"], table["accuracy"], s=size, alpha=0.7)
    ax.set(xlabel="target value (a running sum)", ylabel="greedy token accuracy", ylim=(-0.03, 1.03),
           title="Accuracy by target value")
    seen = table["train_count"].clip(lower=1)  # a value never seen in training drawn at 1
    ax_seen.scatter(seen, table["accuracy"], s=size, alpha=0.7, color="tab:orange")
    ax_seen.set(xscale="log", xlabel="times the value is a target token in training (0 drawn at 1)",
                ylabel="greedy token accuracy", ylim=(-0.03, 1.03), title="Accuracy by training frequency")
    for axis in (ax, ax_seen):
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_valid_score(scores: pd.DataFrame, name: str, out: Path):
    """The validation score ``name`` after each epoch (columns epoch and ``name``)."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(scores["epoch"], scores[name], "o-")
    ax.set(xlabel="epoch", ylabel=f"{name}, greedy, validation split", title="Validation score by epoch")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_loss_by_length(by_length: pd.DataFrame, out: Path):
    """An LM's validation loss by the tokens of context read (columns length, loss)."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(by_length["length"], by_length["loss"], "o-", markersize=2)
    ax.set(xlabel="tokens of context read", ylabel="loss (nats per token)", title="Loss by context length")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_score_by_length(score_by_length: dict, counts: dict, out: Path, name: str = "bleu"):
    """One bar per group of source lengths, labelled with its number of sentences: the task's score ``name``."""
    groups = list(score_by_length)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bars = ax.bar(groups, [score_by_length[g] for g in groups], color="tab:blue")
    ax.bar_label(bars, labels=[f"n={counts.get(g, 0)}" for g in groups], fontsize=8)
    shown = "sacreBLEU" if name == "bleu" else name.replace("_", " ")
    ax.set(xlabel="source length (words)", ylabel=f"{shown}, greedy", title=f"{shown} by source length")
    ax.margins(y=0.12)  # room for the labels above the bars
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
