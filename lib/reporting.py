"""The report stage: reports/<task>/report.md with metrics, curves and attention heatmaps."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from lib import checkpoint  # noqa: E402
from lib.config import ReportConfig  # noqa: E402
from lib.data import collate, read_split  # noqa: E402
from lib.masks import padding_mask, target_mask  # noqa: E402
from lib.tokenizer import encode_pairs, load_tokenizer, special_ids  # noqa: E402


def flatten(metrics: dict, prefix: str = "") -> dict:
    """{"greedy": {"bleu": 1}} -> {"greedy.bleu": 1}"""
    flat = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_curve(live_dir: Path, name: str) -> pd.DataFrame:
    """One dvclive metric as (step, value) rows."""
    path = live_dir / "plots" / "metrics" / f"{name}.tsv"
    frame = pd.read_csv(path, sep="\t")
    return frame.rename(columns={frame.columns[-1]: "value"})


def plot_losses(live_dir: Path, out: Path):
    fig, ax = plt.subplots(figsize=(7, 4))
    train = read_curve(live_dir, "train/loss")
    # Per-step losses are noisy: show a running mean over ~1% of the run.
    window = max(1, len(train) // 100)
    ax.plot(train["step"], train["value"].rolling(window, min_periods=1).mean(), label="train (label-smoothed)")
    valid = read_curve(live_dir, "valid/loss")
    ax.plot(valid["step"], valid["value"], "o-", label="valid (cross-entropy)")
    ax.set(xlabel="step", ylabel="loss per token", yscale="log", title="Training and validation loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_attention_grid(weights: list[torch.Tensor], rows: list[str], cols: list[str], title: str, out: Path):
    """One heatmap per (layer, head): weights[layer] is (H, len(rows), len(cols))."""
    L, H = len(weights), weights[0].size(0)
    fig, axes = plt.subplots(L, H, figsize=(2.2 * H + 1, 2.2 * L + 0.6), squeeze=False)
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


def run(
    task: str,
    cfg: ReportConfig,
    data_dir: str | Path,
    tokenizer_path: str | Path,
    model_path: str | Path,
    metrics_path: str | Path,
    samples_path: str | Path,
    live_dir: str | Path,
    report_path: str | Path,
    figures_dir: str | Path,
):
    report_path, figures_dir, live_dir = Path(report_path), Path(figures_dir), Path(live_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    metrics = flatten(json.loads(Path(metrics_path).read_text()))
    samples = pd.read_csv(samples_path, sep="\t", dtype=str, keep_default_na=False)

    plot_losses(live_dir, figures_dir / "loss.png")
    tokenizer = load_tokenizer(tokenizer_path)
    ids = special_ids(tokenizer)
    model, state = checkpoint.load_model(model_path)
    pairs = encode_pairs(tokenizer, read_split(data_dir, "test"))
    heatmaps = []
    for index in range(min(cfg.n_attention_examples, len(pairs))):
        weights, rows, cols = cross_attention(model, tokenizer, pairs, index, ids)
        name = f"cross_attention_{index + 1}.png"
        plot_attention_grid(weights, rows, cols, f"Cross-attention, test example {index + 1}", figures_dir / name)
        heatmaps.append(name)

    rel = figures_dir.relative_to(report_path.parent)
    values = [f"{v:.4f}" if isinstance(v, float) else str(v) for v in metrics.values()]
    table = pd.DataFrame({"metric": list(metrics), "value": values})
    lines = [
        f"# {task}: report",
        "",
        f"Best model: step {state['step']}, validation loss {state['valid_loss']:.4f}.",
        "",
        "## Test metrics",
        "",
        table.to_markdown(index=False, colalign=("left", "right"), disable_numparse=True),
        "",
        "## Loss",
        "",
        f"![loss curves]({rel}/loss.png)",
        "",
        "## Cross-attention",
        "",
        "Rows: the token being predicted; columns: the source tokens. One panel per layer and head.",
        "",
        *[f"![cross-attention {i + 1}]({rel}/{name})\n" for i, name in enumerate(heatmaps)],
        "## Samples",
        "",
        samples.head(10).to_markdown(index=False),
        "",
    ]
    with checkpoint.atomic_path(report_path) as tmp:
        tmp.write_text("\n".join(lines))
