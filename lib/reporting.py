"""The report stage: reports/<task>/report.md with metrics, curves, attention heatmaps and samples.

Attention weights come from the model's own forward (returned, not stashed),
on the CPU, from the trained weights: nothing is retrained.
"""

import json
import logging
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from lib import checkpoint, files  # noqa: E402
from lib.config import LENGTH_PARAM, LR_PARAM, ConfigError, flatten  # noqa: E402
from lib.data import collate, read_split, read_text  # noqa: E402
from lib.files import not_as_written  # noqa: E402
from lib.tasks import TASKS, get_task  # noqa: E402
from lib.tokenizer import encode_pairs, encode_text, special_ids  # noqa: E402
from transformer.loss import smoothed_loss_floor  # noqa: E402
from transformer.masks import padding_mask, target_mask  # noqa: E402
from transformer.model import parameter_counts  # noqa: E402

log = logging.getLogger(__name__)


def _format(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def metrics_table(metrics: dict) -> str:
    """Every scalar metric; the searches (greedy, beam) side by side; a per-length breakdown (by_length,
    bleu_by_length) has its own plot."""
    searches = {k: v for k, v in metrics.items() if isinstance(v, dict) and (k == "greedy" or k.startswith("beam"))}
    flat = flatten({k: v for k, v in metrics.items() if not k.endswith("by_length") and k not in searches})
    table = pd.DataFrame({"metric": list(flat), "value": [_format(v) for v in flat.values()]})
    lines = [table.to_markdown(index=False, colalign=("left", "right"), disable_numparse=True)]
    if searches:
        first = next(iter(searches.values()))
        # Every search's scores, in first-seen order: beam search adds its length penalty (alpha).
        names = list(dict.fromkeys(k for scores in searches.values() for k in scores if not k.endswith("signature")))
        side = pd.DataFrame({"metric": names, **{search: [_format(scores.get(name, "")) for name in names]
                                                for search, scores in searches.items()}})
        lines += ["", "Decoding (seconds: the whole test set on this machine's CPU):", "",
                  side.to_markdown(index=False, disable_numparse=True)]
        signatures = {k: v for k, v in first.items() if k.endswith("signature")}
        lines += [""] + [f"- {name.replace('_', ' ')}: `{value}`" for name, value in signatures.items()]
        if "search_errors" in first:
            lines += ["- search errors: wrong outputs that the model scores below the reference, which it "
                      "prefers but the search missed; model errors: wrong outputs it scores at least as high as "
                      "the reference, its own preference. Greedy search is judged by the outputs' probability, "
                      "beam search by the length-penalised score it ranks by (`lib.generate --score` scores "
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


# What the report reads of each sample (a row of samples.jsonl), by the kind of model.
SAMPLE_KEYS = {"seq2seq": ("split", "source", "reference", "greedy", "correct", "score", "first", "worst"),
               "lm": ("prompt", "sample")}


def read_samples(path: str | Path, kind: str) -> pd.DataFrame:
    """The evaluate stage's samples.jsonl: a JSON object a line (blank lines aside), at least one, each with
    ``SAMPLE_KEYS[kind]``."""
    path, rows = Path(path), []
    # split at "\n", not splitlines: a text may hold U+2028 as it is
    for number, line in enumerate(evaluate_text(path).split("\n"), 1):
        if not line.strip():  # the last newline's empty rest, or a blank line: no sample
            continue
        try:
            rows.append(row := json.loads(line))
        except json.JSONDecodeError as err:
            raise not_as_written(path, f"line {number}: not JSON ({err.msg})", "evaluate") from None
        if not isinstance(row, dict) or (missing := [k for k in SAMPLE_KEYS[kind] if k not in row]):
            found = f"no {missing[0]!r}" if isinstance(row, dict) else f"a JSON {type(row).__name__}"
            keys = ", ".join(SAMPLE_KEYS[kind])
            raise not_as_written(path, f"line {number}: {found}, where a sample has {keys}", "evaluate")
    if not rows:
        raise not_as_written(path, "no samples", "evaluate")
    return pd.DataFrame(rows)


def index_metrics(path: Path) -> dict:
    """A task's metrics for the index: another task's unreadable metrics.json is its own evaluate stage's to
    mend, so it leaves that task's row without figures, with a warning, rather than stopping this report."""
    try:
        return read_metrics(path)
    except ValueError as err:
        log.warning("%s (reports/index.md shows no metrics for it)", err)
        return {}


def write_index(reports_dir: Path):
    """reports/index.md: one row per task with a report, linking it, with its headline metrics.

    Every report stage rewrites it from what is on disk, so it lists the tasks
    built so far. A task names its headline metrics in ``HEADLINE`` (dotted
    keys of metrics.json; ``*`` matches any beam width).
    """
    from fnmatch import fnmatch

    rows = []
    for report in sorted(Path(reports_dir).glob("*/report.md")):
        task, metrics_path = report.parent.name, report.parent / "metrics.json"
        flat = flatten(index_metrics(metrics_path)) if metrics_path.is_file() else {}
        patterns = getattr(get_task(task), "HEADLINE", ()) if task in TASKS else ()
        headline = [f"{k} {_format(v)}" for p in patterns for k, v in flat.items() if fnmatch(k, p)]
        rows.append({"task": f"[{task}]({task}/report.md)", "headline metrics": ", ".join(headline)})
    table = pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)
    with files.atomic_path(Path(reports_dir) / "index.md") as tmp:
        tmp.write_text("# Reports\n\nOne row per task built so far (`dvc repro` rewrites this page).\n\n"
                       + table + "\n")


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


def curves_caption(first_loss: float, vocab_size: int, smoothing: float, floor: float,
                   repeats: float | None = None, tied: bool = False) -> str:
    """What to expect of the training loss at both ends: at the first step, before any update, a model
    that has learnt nothing predicts every token alike and scores ln V (label smoothing or not); at the
    end, a label-smoothed loss levels off above ``floor``. ``repeats``: the share of positions at which
    the untrained model predicted the token it was given (``lib.model.repeats_input``), the usual cause
    of a first loss far above ln V when most; ``tied``: the model ties its embeddings."""
    uniform = math.log(vocab_size)
    text = (f"The first step's training loss, before any update, was {first_loss:.2f} nats a token; a model "
            f"that has learnt nothing yet and predicts every token alike scores ln {vocab_size} = {uniform:.2f}.")
    if first_loss > uniform + 1:
        text += (" Far above it: the initial weights predict confidently, and wrongly; the first steps go into "
                 "undoing that.")
        if repeats is not None and repeats > 0.5:
            text += f" The untrained model predicted the token it was given at {repeats:.0%} of positions"
            text += (": its input vectors are also its output layer's rows (train.model.tie_embeddings), large "
                     "enough to outweigh the rest of what it reads. Where the loss then lingers on a plateau, "
                     "tie_embeddings: false starts it elsewhere (benchmarks/tie_start.py)." if tied else ".")
    if floor > 0:
        text += (f" The per-step training loss is the label-smoothed loss (train.label_smoothing {smoothing}), "
                 "under dropout: it levels off above the entropy of the smoothed targets, "
                 f"{floor:.2f} nats a token here (dashed). The validation loss is plain cross-entropy in eval "
                 "mode, which can approach 0: that the training loss stays above it is no sign of trouble.")
    return text


def stalled_caption(train: pd.DataFrame, lr: pd.DataFrame, vocab_size: int, kind: str) -> str:
    """Where the training loss (``train``: its (step, value) rows) ended within 10% of ln V, the loss of a
    model that has learnt nothing: what the learning rate (``lr``'s rows, one a step) says of why. Adam moves
    a weight by at most about the learning rate a step, so the rates summed over the run bound how far any
    weight went; below 0.1, about the size the weights start at, the rate was too low to reshape them. Empty
    where the loss fell further."""
    uniform = math.log(vocab_size)
    end = train["value"].iloc[-max(1, len(train) // 100):].mean()  # the last ~1% of steps, as the figure
    if end < 0.9 * uniform:
        return ""
    travel, peak = lr["value"].sum(), lr["value"].max()
    text = (f"The training loss ended at {end:.2f} nats a token, within 10% of the {uniform:.2f} of a model "
            f"that has learnt nothing: this run has learnt little. Adam moves a weight by at most about the "
            f"learning rate a step; summed over the run's {len(lr):,} steps, the rates come to {travel:.3g} "
            f"(peak {peak:.3g})")
    rising = lr["value"].iloc[-1] > lr["value"].iloc[0] and lr["value"].idxmax() == lr.index[-1]
    if travel < 0.1:
        text += (", too little to reshape weights that start at about 0.1 in size: the learning rate is too low "
                 f"(raise {LR_PARAM[kind]})")
    else:
        text += (", enough to move the weights: a rate too high can keep the loss up without diverging (the "
                 f"gradient norm then stays high, middle panel; lower {LR_PARAM[kind]}), and so can targets that the "
                 "inputs do not determine")
    if rising:
        text += (f". The rate was still rising when training stopped: its warmup (train.warmup) is longer than "
                 f"the run; shorten it, or train longer ({LENGTH_PARAM[kind]})")
    return text + "."


def model_line(state: dict) -> str:
    """What model.pt holds: the best weights, or the average of the last epochs' (``averaged_epochs``,
    kept because it validated better than any single epoch)."""
    if state.get("averaged_epochs", 1) > 1:
        return (f"Model: the average of the last {state['averaged_epochs']} epochs' weights, up to step "
                f"{state['step']}, validation loss {state['valid_loss']:.4f} (better than any single epoch's).")
    return f"Best model: step {state['step']}, validation loss {state['valid_loss']:.4f}."


POSITIONS = {
    "sinusoidal": "sinusoidal positions added to the embeddings (sec. 3.5)",
    "learned": "learned positions, a vector for each of the first max_len, added to the embeddings",
    "rope": "rotary positions (RoPE): the queries and keys turned by their positions, no position vectors",
    "alibi": "ALiBi: attention scores lowered in proportion to the distance, no position vectors",
}


def architecture(cfg, state: dict) -> str:
    """The model of ``state`` (model.pt's contents), ``cfg`` its ModelConfig, in a sentence."""
    if state["kind"] == "lm":
        shape = f"A decoder-only language model of {cfg.decoder_layers} layer{'s' * (cfg.decoder_layers != 1)}"
    else:
        shape = (f"An encoder-decoder of {cfg.encoder_layers} encoder and {cfg.decoder_layers} decoder "
                 f"layer{'s' * ((cfg.encoder_layers, cfg.decoder_layers) != (1, 1))}")
    if cfg.norm == "rmsnorm":
        norm = "Pre-LN with RMSNorm, and a final RMSNorm" if cfg.norm_first else "Post-LN with RMSNorm"
    else:
        norm = "Pre-LN, with a final LayerNorm" if cfg.norm_first else "Post-LN, as in the paper"
    dropout = f"dropout {cfg.dropout}" if cfg.dropout else "no dropout"
    if cfg.activation_dropout:
        dropout += f" ({cfg.activation_dropout} on the feed-forward's activation)"
    heads = f"{cfg.n_heads} heads of width {cfg.head_dim}"
    if cfg.kv_heads != cfg.n_heads:
        heads += f" sharing {cfg.kv_heads} key/value head{'s' * (cfg.kv_heads != 1)}"
    activation = {"relu": "ReLU", "gelu": "GELU", "swiglu": "SwiGLU"}[cfg.activation]
    widths = (f"d_model {cfg.d_model}, {heads}, a {activation} feed-forward of width {cfg.d_ff}, {dropout}"
              + ("" if cfg.bias else ", no biases"))
    source, target = state["src_vocab_size"], state["tgt_vocab_size"]
    if state["kind"] == "lm":
        vocabulary = f"a vocabulary of {target:,} tokens"
        tie = ", one matrix for the embedding and the output layer (tied)"
    elif state["joint_vocab"]:
        vocabulary = f"one vocabulary of {target:,} tokens for source and target"
        tie = ", one matrix for the source embedding, the target embedding and the output layer (tied, sec. 3.4)"
    else:
        vocabulary = f"vocabularies of {source:,} (source) and {target:,} (target) tokens"
        tie = ", one matrix for the target embedding and the output layer (tied)"
    return (f"{shape}, {norm}: {widths}; {POSITIONS[cfg.positional]}; {vocabulary}"
            f"{tie if cfg.tie_embeddings else ', embeddings and output layer untied'}.")


def model_section(model, state: dict, live_dir: Path) -> list[str]:
    """What was trained: the architecture, where its parameters are, and how long and fast it trained."""
    counts = parameter_counts(model)
    total = counts["total"]
    table = pd.DataFrame({"part": list(counts), "parameters": [f"{n:,}" for n in counts.values()],
                          "share": [f"{100 * n / total:.1f}%" for n in counts.values()]})
    lines = ["## Model", "", architecture(model.cfg, state), "",
             table.to_markdown(index=False, colalign=("left", "right", "right"), disable_numparse=True), ""]
    if model.cfg.tie_embeddings:
        own = ": only its bias is its own" if model.cfg.bias else ""
        lines += [f"The tied output layer's weights are the embedding's, counted there{own}.", ""]
    logged = read_curves(live_dir, ("train/tokens_per_s", "train/mfu", "epoch"))
    speed, mfu, epoch = logged["train/tokens_per_s"], logged["train/mfu"], logged["epoch"]
    trained = f"Trained for {speed['step'].iloc[-1]:,} steps"
    if epoch is not None:  # the encoder-decoder's
        trained += f" ({epoch['value'].iloc[-1]} epochs)"
    tokens = "source and target tokens" if state["kind"] == "seq2seq" else "tokens"
    trained += f", at a median {speed['value'].median():,.0f} {tokens} a second"
    if mfu is not None:
        trained += f" ({100 * mfu['value'].median():.0f}% of the hardware's peak FLOPs, train.peak_tflops)"
    return lines + [trained + ".", ""]


def validation_caption(valid: pd.DataFrame | None, kind: str) -> str:
    """Where the validation loss went, from its (step, value) rows: still falling at the last evaluation
    (train longer), risen well above its lowest (over-fitting), or levelled off. Empty without two
    evaluations."""
    if valid is None or len(valid) < 2:
        return ""
    steps, values = valid["step"].tolist(), valid["value"].tolist()
    best = min(range(len(values)), key=values.__getitem__)
    last, previous = values[-1], values[-2]
    text = f"The validation loss, over {len(values)} evaluations, was lowest at step {steps[best]} ({values[best]:.4f})"
    if best == len(values) - 1:
        if previous - last > 0.01 * previous:
            return (text + f", the last, and still falling ({previous:.4f} at step {steps[-2]}): a longer run "
                    f"({LENGTH_PARAM[kind]}) would likely lower it further.")
        return text + ", the last, where it had levelled off."
    rise = last / values[best] - 1
    text += f"; the last, at step {steps[-1]}, is {last:.4f}, {rise:+.1%}."
    if rise > 0.05:
        return (text + " Rising after its lowest point is over-fitting: the model learns its training data "
                "better than it generalises. model.pt holds the best weights (or the last epochs' average), not the "
                "last; more dropout or a shorter run are the usual remedies.")
    return text + " A plateau: a longer run would gain little."


def plot_attention_grid(weights: list[torch.Tensor], rows: list[str], cols: list[str], title: str, out: Path,
                        red_rows: frozenset[int] = frozenset()):
    """One heatmap per (layer, head): weights[layer] is (H, len(rows), len(cols)); the labels of
    ``red_rows`` are drawn in red."""
    L, H = len(weights), weights[0].size(0)
    n = max(len(rows), len(cols))
    cell = min(4.0, max(2.2, 0.11 * n))  # inches per panel: room for every label, not a poster
    font = 6 if n <= 32 else 4.5
    # Every panel has the same tokens: label the left column and the bottom row only.
    fig, axes = plt.subplots(L, H, figsize=(cell * H + 1, cell * L + 0.8), squeeze=False, sharex=True,
                             sharey=True)
    for layer, layer_weights in enumerate(weights):
        for head in range(H):
            ax = axes[layer][head]
            ax.imshow(layer_weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer + 1} head {head + 1}", fontsize=8)
    axes[0][0].set_xticks(range(len(cols)), cols)
    axes[0][0].set_yticks(range(len(rows)), rows)
    for ax in axes.flat:
        ax.label_outer()
        ax.tick_params(labelsize=font)
        ax.tick_params(axis="x", labelrotation=90)
        for row, label in enumerate(ax.get_yticklabels()):
            if row in red_rows:
                label.set_color("tab:red")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # leave the top strip to the title
    fig.savefig(out, dpi=110, bbox_inches="tight")  # long sub-word labels are never clipped
    plt.close(fig)


def visible(token: str) -> str:
    """A label that shows whitespace tokens."""
    return {" ": "␣", "\n": "⏎", "\t": "⇥"}.get(token, token)


@torch.no_grad()
def attention_maps(model, batch, ids) -> tuple[dict[str, list[torch.Tensor]], torch.Tensor]:
    """Teacher-forced attention of a batch, per layer: encoder self (B, H, S, S),
    decoder self (B, H, T, T) and cross (B, H, T, S), straight from the forward;
    and the token the model finds likeliest at each decoder position (B, T)."""
    src_mask = padding_mask(batch.src, ids.pad)
    memory, encoder = model.encode(batch.src, src_mask)
    hidden, decoder = model.decode(batch.tgt_in, memory, target_mask(batch.tgt_in, ids.pad), src_mask)
    maps = {
        "encoder self-attention": encoder,
        "decoder self-attention": [self_w for self_w, _ in decoder],
        "cross-attention": [cross for _, cross in decoder],
    }
    return maps, model.generator(hidden).argmax(dim=-1)


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
                            red)
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


def plot_bleu_by_length(bleu_by_length: dict, counts: dict, out: Path):
    """One bar per group of source lengths, labelled with its number of sentences."""
    groups = list(bleu_by_length)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bars = ax.bar(groups, [bleu_by_length[g] for g in groups], color="tab:blue")
    ax.bar_label(bars, labels=[f"n={counts.get(g, 0)}" for g in groups], fontsize=8)
    ax.set(xlabel="source length (words)", ylabel="sacreBLEU, greedy", title="BLEU by source length")
    ax.margins(y=0.12)  # room for the labels above the bars
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def token_strings(tokenizer, ids: torch.Tensor) -> list[str]:
    return [tokenizer.id_to_token(t) for t in ids.tolist()]


def breaking_section(module, model, tokenizers, by_length: dict, samples: pd.DataFrame, trained: tuple[int, int],
                     figures_dir: Path, rel: Path) -> list[str]:
    """The first wrong sequence of the length where the model breaks (``module.breaking_length``), with
    the attention that wrote its greedy output: the model teacher-forced on that output, so that each
    decoder row is the step that chose its token."""
    lines = ["## Where it breaks", ""]
    length = module.breaking_length(by_length)
    if length is None:
        return lines + ["Every sequence of every length studied comes out exact.", ""]
    study = samples[samples["split"] == module.EXTRA_SPLIT]
    example = study[study["source"].str.split().str.len().eq(length) & ~study["correct"]].iloc[0]
    ids = special_ids(tokenizers)
    # The same source twice: with the model's output as the target, then with the reference.
    pairs = encode_pairs(tokenizers, pd.DataFrame({"src": [example.source] * 2,
                                                   "tgt": [example.greedy, example.reference]}))
    batch = collate(pairs, [0], ids)
    maps, likeliest = attention_maps(model, batch, ids)
    T = len(pairs.tgt[0]) + 1  # the output and its <eos>
    expected = pairs.tgt[1] + [ids.eos]
    said = likeliest[0, :T].tolist()  # the greedy output and its <eos>, as the decoder chose them
    red = frozenset(t for t, token in enumerate(said) if t >= len(expected) or token != expected[t])
    share = module.lengths_as_numbers(by_length)[length]
    lines += [f"At length {length}, exact match is {share:.2f} (the model trained on lengths {trained[0]}-"
              f"{trained[1]}). The first wrong sequence of that length:", "",
              pd.DataFrame({"": ["source", "reference", "greedy output"],
                            "tokens": [f"`{example.source}`", f"`{example.reference}`",
                                       f"`{example.greedy}`" if example.greedy else "(empty)"]}
                           ).to_markdown(index=False), "",
              "The attention that wrote that output: the model teacher-forced on its own greedy output, so "
              "each decoder row is the step that chose its token. Red rows chose a token other than the "
              "reference's.", ""]
    return lines + pair_heatmaps(maps, batch, pairs, 0, tokenizers, f"length {length}, wrong", "breaks", figures_dir,
                                 rel, likeliest[0, :T], red)


def seq2seq_sections(module, cfg, data_dir, tokenizers, model, metrics, samples, figures_dir: Path, rel: Path):
    """``module``: the task's, which reads the breakdowns its evaluate stage wrote (cumsum's
    by_length, multi30k's bleu_by_length)."""
    ids = special_ids(tokenizers)
    pairs = encode_pairs(tokenizers, read_split(data_dir, "test").head(cfg.n_attention_examples))  # the drawn ones
    examples = list(range(len(pairs)))
    batch = collate(pairs, examples, ids)
    maps, _ = attention_maps(model, batch, ids)
    lines = ["## Attention", "",
             "For each example, one panel per layer (rows) and head (columns). Rows of a panel: the "
             "decoder position, labelled by the token it predicts (encoder: the source token); columns: "
             "the tokens it reads. Decoder self-attention is empty above the diagonal: no position sees "
             "the future.", ""]
    for i in examples:
        src = token_strings(tokenizers.source, batch.src[i, :len(pairs.src[i])])
        lines += [f"### Test example {i + 1}: `{' '.join(src)}`", ""]
        lines += pair_heatmaps(maps, batch, pairs, i, tokenizers, f"test example {i + 1}", str(i + 1), figures_dir,
                               rel)
    if "by_length" in metrics:
        train_lengths = read_split(data_dir, "train")["src"].str.split().str.len()
        trained = (train_lengths.min(), train_lengths.max())
        plot_by_length(module.lengths_as_numbers(metrics["by_length"]), trained, figures_dir / "by_length.png")
        lines += ["## Accuracy by sequence length", "",
                  "Exact-sequence match on held-out sequences of every length, including lengths "
                  f"longer than any seen in training ({trained[0]}-{trained[1]}). Most sequences of every length "
                  f"from {trained[0]} up to {metrics['exact_up_to_length']} come out exact (`exact_up_to_length`).",
                  "",
                  f"![accuracy by length]({rel}/by_length.png)", ""]
        lines += breaking_section(module, model, tokenizers, metrics["by_length"], samples, trained, figures_dir,
                                  rel)
    if "bleu_by_length" in metrics:
        test = samples[samples["split"] == "test"]
        counts = test["source"].map(module.length_group).value_counts().to_dict()
        plot_bleu_by_length(metrics["bleu_by_length"], counts, figures_dir / "bleu_by_length.png")
        lines += ["## BLEU by source length", "",
                  "Greedy sacreBLEU of the test sentences, grouped by the length of their source in words "
                  "(n: the sentences in a group).", "", f"![BLEU by source length]({rel}/bleu_by_length.png)", ""]
    columns = ["source", "reference", "greedy", *[c for c in samples.columns if c.startswith("beam")], "correct"]
    for kind, title in (("first", "First test examples"), ("worst", "Worst test examples")):
        chosen = samples[samples[kind]]
        if kind == "worst":
            chosen = chosen.sort_values("score", kind="stable")
        lines += [f"## {title}", "", chosen[columns].to_markdown(index=False), ""]
    return lines


@torch.no_grad()
def lm_sections(cfg, data_dir, tokenizers, model, samples, figures_dir: Path, rel: Path):
    tokenizer = tokenizers.target
    ids = encode_text(tokenizer, read_text(data_dir, "valid"))[: cfg.passage_tokens]  # (T,)
    _, layers = model.forward_with_attention(ids[None])  # per layer (1, H, T, T)
    labels = [visible(token) for token in token_strings(tokenizer, ids)]
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


def run(task, cfg, data_dir, tokenizer_dir, model_path, metrics_path, samples_path, live_dir, report_path,
        figures_dir):
    """Draw the figures into a fresh directory and write report.md beside its place; then both go into
    place together: an error or Ctrl-C half way (a full disk writing report.md too) leaves the previous
    report and its figures as they were, and a report with fewer figures than the last leaves none of the
    last's behind."""
    report_path, figures_dir = Path(report_path), Path(figures_dir)
    rel = figures_dir.relative_to(report_path.parent)
    with files.atomic_dir(figures_dir) as drawing:
        lines = report_lines(task, cfg, data_dir, tokenizer_dir, model_path, metrics_path, samples_path,
                             Path(live_dir), drawing, rel)
        with files.atomic_path(report_path) as tmp:
            tmp.write_text("\n".join(lines))
    write_index(report_path.parent.parent)


def report_lines(task, cfg, data_dir, tokenizer_dir, model_path, metrics_path, samples_path, live_dir: Path,
                 figures_dir: Path, rel: Path) -> list[str]:
    """report.md's lines, drawing its figures into ``figures_dir``, which the report links as ``rel``."""
    module = get_task(task)
    metrics, samples = read_metrics(metrics_path), read_samples(samples_path, module.KIND)
    model, tokenizers, state = checkpoint.load_trained(model_path, tokenizer_dir, task=task)
    if module.KIND == "lm" and cfg.passage_tokens > state["block_size"]:  # checked before anything is drawn
        raise ConfigError(f"report.passage_tokens: {cfg.passage_tokens} is longer than the blocks the model "
                          f"was trained on (train.block_size {state['block_size']})")

    smoothing = state.get("label_smoothing", 0.0)  # seq2seq models; an LM trains without
    floor = smoothed_loss_floor(state["tgt_vocab_size"], smoothing)
    curves = read_curves(live_dir)
    unlogged = [name for name in CURVES if name.startswith("train/") and curves[name] is None]
    if unlogged:  # every run logs these: --live names some other directory
        raise FileNotFoundError(f"{live_dir / 'plots' / 'metrics' / unlogged[0]}.tsv: training curve not found "
                                "(run the train stage first)")
    plot_losses(curves, figures_dir / "loss.png", floor)
    first_loss = curves["train/loss"]["value"].iloc[0]
    validation = validation_caption(curves["valid/loss"], module.KIND)
    stalled = stalled_caption(curves["train/loss"], curves["train/lr"], state["tgt_vocab_size"], module.KIND)
    lines = [
        f"# {task}: report", "",
        model_line(state), "",
        *model_section(model, state, live_dir),
        "## Metrics", "", metrics_table(metrics), "",
        "## Training curves", "", f"![loss curves, gradient norm and learning rate]({rel}/loss.png)", "",
        curves_caption(first_loss, state["tgt_vocab_size"], smoothing, floor, state.get("initial_repeats_input"),
                       model.cfg.tie_embeddings), "",
        *([stalled, ""] if stalled else []),
        *([validation, ""] if validation else []),
    ]
    if module.KIND == "lm":
        lines += lm_sections(cfg, data_dir, tokenizers, model, samples, figures_dir, rel)
    else:
        lines += seq2seq_sections(module, cfg, data_dir, tokenizers, model, metrics, samples, figures_dir, rel)
    return lines
