"""What the report says in words beside its figures: the model in a sentence and its parameters by part, and
what the curves show (the first loss against ln V, a loss that stalled, where the validation loss went, what
stopped training)."""

import json
import math
from pathlib import Path

import pandas as pd

from lib.core.families import params_family
from lib.report.families import REPORTING
from lib.report.pages import metric_name
from lib.tasks.outputs import STOPPED
from lib.train.curves import read_curves
from transformer.model import parameter_counts


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
                     "tie_embeddings: false starts it elsewhere (benchmarks/length_study/tie_start.py)."
                     if tied else ".")
    if floor > 0:
        text += (f" The per-step training loss is the label-smoothed loss (train.label_smoothing {smoothing}), "
                 "under dropout: it levels off above the entropy of the smoothed targets, "
                 f"{floor:.2f} nats a token here (dashed). The validation loss is plain cross-entropy in eval "
                 "mode, which can approach 0: that the training loss stays above it is no sign of trouble.")
    return text


def stalled_caption(train: pd.DataFrame, lr: pd.DataFrame, vocab_size: int, family: str) -> str:
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
    params = params_family(family)
    if travel < 0.1:
        text += (", too little to reshape weights that start at about 0.1 in size: the learning rate is too low "
                 f"(raise {params.lr_param})")
    else:
        text += (", enough to move the weights: a rate too high can keep the loss up without diverging (the "
                 f"gradient norm then stays high, middle panel; lower {params.lr_param}), and so can targets that the "
                 "inputs do not determine")
    if rising:
        text += (f". The rate was still rising when training stopped: its warmup (train.warmup) is longer than "
                 f"the run; shorten it, or train longer ({params.length_param})")
    return text + "."


def model_line(state: dict) -> str:
    """What model.pt holds: the best weights, or the average of the last epochs' or checkpoints'
    (``averaged_epochs``, ``averaged_checkpoints``: kept because it validated better than any single epoch)."""
    n = state.get("averaged_checkpoints") or state.get("averaged_epochs", 1)
    if n > 1:
        what = (f"checkpoints' weights (one every {state['average_every']} steps)" if "averaged_checkpoints" in state
                else "epochs' weights")
        return (f"Model: the average of the last {n} {what}, up to step {state['step']}, validation loss "
                f"{state['valid_loss']:.4f} (better than any single epoch's).")
    return f"Best model: step {state['step']}, validation loss {state['valid_loss']:.4f}."


POSITIONS = {
    "sinusoidal": "sinusoidal positions added to the embeddings (sec. 3.5)",
    "learned": "learned positions, a vector for each of the first max_len, added to the embeddings",
    "rope": "rotary positions (RoPE): the queries and keys turned by their positions, no position vectors",
    "alibi": "ALiBi: attention scores lowered in proportion to the distance, no position vectors",
}


def architecture(cfg, state: dict) -> str:
    """The model of ``state`` (model.pt's contents), ``cfg`` its ModelConfig, in a sentence."""
    family = REPORTING[state["kind"]]
    shape = family.shape(cfg)
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
    vocabulary, tie = family.vocabulary(state)
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
    trained += f", at a median {speed['value'].median():,.0f} {REPORTING[state['kind']].tokens} a second"
    if mfu is not None:
        trained += f" ({100 * mfu['value'].median():.0f}% of the hardware's peak FLOPs, train.peak_tflops)"
    return lines + [trained + ".", ""]


def validation_caption(valid: pd.DataFrame | None, family: str) -> str:
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
                    f"({params_family(family).length_param}) would likely lower it further.")
        return text + ", the last, where it had levelled off."
    rise = last / values[best] - 1
    text += f"; the last, at step {steps[-1]}, is {last:.4f}, {rise:+.1%}."
    if rise > 0.05:
        return (text + " Rising after its lowest point is over-fitting: the model learns its training data "
                "better than it generalises. model.pt holds the best weights (or the last epochs' average), not the "
                "last; more dropout or a shorter run are the usual remedies.")
    return text + " A plateau: a longer run would gain little."


def stop_caption(live_dir: Path) -> str:
    """Why training stopped (stopped.json, which the training loop writes beside its curves), at which
    epoch, whether the validation score was still rising then, and how the rate cooled down (a translation
    task's). Empty without the file (a run from before it)."""
    path = Path(live_dir) / STOPPED
    if not path.is_file():
        return ""
    stop = json.loads(path.read_text(encoding="utf-8"))
    if "epoch" not in stop:  # an LM's: its steps
        return f"Training stopped: {stop['reason']}."
    rising = ""
    if stop["still_rising"]:
        before, after = stop["last_scores"]
        rising = f", with validation {metric_name(stop['valid_metric'])} still rising ({before:.4g} -> {after:.4g})"
    budget = stop["param"] == "time_budget_minutes"
    if budget:
        text = f"Training was stopped by the time budget at epoch {stop['epoch']} ({stop['reason']}){rising}."
    else:
        text = f"Training stopped at epoch {stop['epoch']}: {stop['reason']}{rising}."
    if stop.get("cooldown"):
        end = "the time budget's end" if budget else f"its last step, {stop['planned_steps']:,}"
        text += (f" Its rate fell linearly to 0 over the run's last {stop['cooldown']:.0%} (train.cooldown), "
                 f"toward {end}.")
    return text + (" A larger budget would likely give a better model." if budget and rising else "")
