"""The report stage: reports/<task>/report.md with metrics, curves, attention heatmaps and samples.

Attention weights come from the model's own forward (returned, not stashed),
on the CPU, from the trained weights: nothing is retrained.
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from lib import checkpoint  # noqa: E402
from lib.config import flatten  # noqa: E402
from lib.data import collate, read_split, read_text  # noqa: E402
from lib.masks import padding_mask, target_mask  # noqa: E402
from lib.tasks import get_task  # noqa: E402
from lib.tokenizer import encode_pairs, load_tokenizer, special_ids  # noqa: E402


def metrics_table(metrics: dict) -> str:
    flat = flatten(metrics)
    values = [f"{v:.4f}" if isinstance(v, float) else str(v) for v in flat.values()]
    table = pd.DataFrame({"metric": list(flat), "value": values})
    return table.to_markdown(index=False, colalign=("left", "right"), disable_numparse=True)


def read_curve(live_dir: Path, name: str) -> pd.DataFrame | None:
    """One dvclive metric as (step, value) rows; None when it was not logged."""
    path = live_dir / "plots" / "metrics" / f"{name}.tsv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path, sep="\t")
    return frame.rename(columns={frame.columns[-1]: "value"})


def plot_losses(live_dir: Path, out: Path):
    """Training and validation loss (left) and the learning-rate schedule (right)."""
    fig, (ax, ax_lr) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    train = read_curve(live_dir, "train/loss")
    # Per-step losses are noisy: show a running mean over ~1% of the run.
    window = max(1, len(train) // 100)
    ax.plot(train["step"], train["value"].rolling(window, min_periods=1).mean(), label="train (per step)")
    for name, label in (("eval/train_loss", "train (fixed batches)"), ("valid/loss", "validation")):
        curve = read_curve(live_dir, name)
        if curve is not None:
            ax.plot(curve["step"], curve["value"], "o-", markersize=3, label=label)
    ax.set(xlabel="step", ylabel="loss (nats per token)", yscale="log", title="Training and validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    lr = read_curve(live_dir, "train/lr")
    ax_lr.plot(lr["step"], lr["value"], color="tab:purple")
    ax_lr.set(xlabel="step", ylabel="learning rate", title="Learning-rate schedule")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_attention_grid(weights: list[torch.Tensor], rows: list[str], cols: list[str], title: str, out: Path):
    """One heatmap per (layer, head): weights[layer] is (H, len(rows), len(cols))."""
    L, H = len(weights), weights[0].size(0)
    cell = max(2.2, 0.14 * max(len(rows), len(cols)))
    fig, axes = plt.subplots(L, H, figsize=(cell * H + 1, cell * L + 0.6), squeeze=False)
    for layer, layer_weights in enumerate(weights):
        for head in range(H):
            ax = axes[layer][head]
            ax.imshow(layer_weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(len(cols)), cols, fontsize=6, rotation=90)
            ax.set_yticks(range(len(rows)), rows, fontsize=6)
            ax.set_title(f"layer {layer + 1} head {head + 1}", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def visible(token: str) -> str:
    """A label that shows whitespace tokens."""
    return {" ": "␣", "\n": "⏎", "\t": "⇥"}.get(token, token)


@torch.no_grad()
def cross_attention(model, tokenizer, pairs, index: int, ids):
    """Teacher-forced cross-attention of one test pair: per layer (H, T, S), and labels."""
    batch = collate(pairs, [index], ids)
    src_mask = padding_mask(batch.src, ids.pad)
    memory, _ = model.encode(batch.src, src_mask)
    _, layers = model.decode(batch.tgt_in, memory, target_mask(batch.tgt_in, ids.pad), src_mask)
    src_labels = [tokenizer.id_to_token(i) for i in batch.src[0].tolist()]
    # Row t reads tgt_in[t] and predicts tgt_out[t]: label rows by the prediction.
    tgt_labels = [tokenizer.id_to_token(i) for i in batch.tgt_out[0].tolist()]
    return [cross[0] for _, cross in layers], tgt_labels, src_labels


def seq2seq_sections(cfg, data_dir, tokenizer, model, samples: pd.DataFrame, figures_dir: Path, rel: Path):
    ids = special_ids(tokenizer)
    pairs = encode_pairs(tokenizer, read_split(data_dir, "test"))
    lines = ["## Cross-attention", "",
             "Rows: the token being predicted; columns: the source tokens. One panel per layer and head.", ""]
    for index in range(min(cfg.n_attention_examples, len(pairs))):
        weights, rows, cols = cross_attention(model, tokenizer, pairs, index, ids)
        name = f"cross_attention_{index + 1}.png"
        plot_attention_grid(weights, rows, cols, f"Cross-attention, test example {index + 1}", figures_dir / name)
        lines += [f"![cross-attention {index + 1}]({rel}/{name})", ""]
    lines += ["## Samples", "", samples.head(10).to_markdown(index=False), ""]
    return lines


@torch.no_grad()
def lm_sections(cfg, data_dir, tokenizer, model, samples: pd.DataFrame, figures_dir: Path, rel: Path):
    ids = tokenizer.encode(read_text(data_dir, "valid"), add_special_tokens=False).ids[: cfg.passage_tokens]
    _, layers = model.forward_with_attention(torch.tensor([ids]))
    labels = [visible(tokenizer.id_to_token(i)) for i in ids]
    name = "self_attention.png"
    plot_attention_grid([w[0] for w in layers], labels, labels,
                        "Self-attention over the start of the validation text", figures_dir / name)
    lines = ["## Self-attention", "",
             "Rows: the position predicting the next token; columns: the positions it reads. "
             "The upper triangle is empty: no position sees the future.", "",
             f"![self-attention]({rel}/{name})", "", "## Samples", ""]
    for row in samples.itertuples():
        lines += [f"Prompt `{row.prompt!r}`:", "", "```", row.prompt + row.sample, "```", ""]
    return lines


def run(task, cfg, data_dir, tokenizer_path, model_path, metrics_path, samples_path, live_dir, report_path,
        figures_dir):
    report_path, figures_dir, live_dir = Path(report_path), Path(figures_dir), Path(live_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    rel = figures_dir.relative_to(report_path.parent)
    metrics = json.loads(Path(metrics_path).read_text())
    samples = pd.read_json(samples_path, lines=True)
    tokenizer = load_tokenizer(tokenizer_path)
    model, state = checkpoint.load_model(model_path)

    plot_losses(live_dir, figures_dir / "loss.png")
    lines = [
        f"# {task}: report", "",
        f"Best model: step {state['step']}, validation loss {state['valid_loss']:.4f}.", "",
        "## Metrics", "", metrics_table(metrics), "",
        "## Training curves", "", f"![loss curves and learning rate]({rel}/loss.png)", "",
    ]
    sections = lm_sections if get_task(task).KIND == "lm" else seq2seq_sections
    lines += sections(cfg, data_dir, tokenizer, model, samples, figures_dir, rel)
    with checkpoint.atomic_path(report_path) as tmp:
        tmp.write_text("\n".join(lines))
