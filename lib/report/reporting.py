"""The report stage: reports/<task>/report.md with metrics, curves, attention heatmaps and samples.

Attention weights come from the model's own forward (returned, not stashed),
on the CPU, from the trained weights: nothing is retrained.
"""

import io
import json
import logging
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch

from lib.model import checkpoint
from lib.core import files
from lib.report.attention_view import lm_summary, lm_view, seq2seq_summary, seq2seq_view, summary_lines
from lib.report.captions import curves_caption, model_line, model_section, stalled_caption, validation_caption
from lib.core.config import ConfigError, flatten
from lib.train.curves import CURVES, read_curves
from lib.data.pairs import collate, read_split, read_text
from lib.report.figures import (attention_maps, pair_heatmaps, plot_accuracy_by_value, plot_attention_grid,
                         plot_bleu_by_length, plot_by_length, plot_loss_by_length, plot_losses, plot_valid_score,
                         token_strings, visible)
from lib.core.files import not_as_written
from lib.report.pages import card_html, headline, report_html
from lib.tasks import get_task
from lib.data.tokenizer import encode_pairs, encode_text, special_ids
from transformer.loss import smoothed_loss_floor

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


def value_section(table: pd.DataFrame, figures_dir: Path, rel: Path) -> list[str]:
    """cumsum's accuracy by target value and by how often the value occurs in training."""
    plot_accuracy_by_value(table, figures_dir / "accuracy_by_value.png")
    weak = [f"{row.value} ({row.accuracy:.2f}, seen {row.train_count} times in training)"
            for row in table[table["accuracy"] < 0.99].itertuples()]
    said = f"The values below 99%: {', '.join(weak)}." if weak else \
        "Every target value comes out right at least 99% of the time."
    return ["## Accuracy by target value", "",
            "Greedy token accuracy on the test split by the value of the target token, and against how often "
            "that value is a target token in training (a point's area: its test tokens). Large sums are rare in "
            f"training; a model short of them falls back to a common one. {said}", "",
            f"![accuracy by target value]({rel}/accuracy_by_value.png)", ""]


def seq2seq_sections(module, cfg, data_dir, tokenizers, model, metrics, samples, by_length: pd.DataFrame,
                     figures_dir: Path, rel: Path):
    """``module``: the task's, which reads the score by length its evaluate stage wrote (cumsum's exact match
    by digits, multi30k's BLEU by source words)."""
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
    if "exact_match" in by_length.columns:
        shares = dict(zip(by_length["length"].astype(int), by_length["exact_match"]))
        train_lengths = read_split(data_dir, "train")["src"].str.split().str.len()
        trained = (train_lengths.min(), train_lengths.max())
        plot_by_length(shares, trained, figures_dir / "by_length.png")
        lines += ["## Accuracy by sequence length", "",
                  "Exact-sequence match on held-out sequences of every length, including lengths "
                  f"longer than any seen in training ({trained[0]}-{trained[1]}). Most sequences of every length "
                  f"from {trained[0]} up to {metrics['exact_up_to_length']} come out exact (`exact_up_to_length`).",
                  "",
                  f"![accuracy by length]({rel}/by_length.png)", ""]
        lines += breaking_section(module, model, tokenizers, shares, samples, trained, figures_dir,
                                  rel)
        lines += value_section(module.accuracy_by_value(samples, read_split(data_dir, "train")), figures_dir, rel)
    if "bleu" in by_length.columns:
        plot_bleu_by_length(dict(zip(by_length["group"], by_length["bleu"])),
                            dict(zip(by_length["group"], by_length["sentences"])), figures_dir / "bleu_by_length.png")
        lines += ["## BLEU by source length", "",
                  "Greedy sacreBLEU of the test sentences, grouped by the length of their source in words "
                  "(n: the sentences in a group).", "", f"![BLEU by source length]({rel}/bleu_by_length.png)", ""]
    lines += summary_lines(seq2seq_summary(model, tokenizers, read_split(data_dir, "test")),
                           "the source's <eos> (decoder self-attention: <bos>)", "test split, teacher-forced")
    columns = ["source", "reference", "greedy", *[c for c in samples.columns if c.startswith("beam")], "correct"]
    lines += ["## First test examples", "", samples[samples["first"]][columns].to_markdown(index=False), ""]
    # The worst the evaluate stage kept, by the task's score: only the wrong outputs among them
    worst = samples[samples["worst"] & ~samples["correct"].astype(bool)].sort_values("score", kind="stable")
    lines += ["## Worst test examples", "", worst[columns].to_markdown(index=False) if len(worst) else
              "Every test output is correct: there is no wrong one to show.", ""]
    return lines


@torch.no_grad()
def lm_sections(cfg, data_dir, tokenizers, model, samples, by_length: pd.DataFrame, figures_dir: Path, rel: Path,
                block_size: int):
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
             f"![self-attention]({rel}/{name})", ""]
    lines += summary_lines(lm_summary(model, tokenizer, read_text(data_dir, "valid"), block_size),
                           "the block's first token", "validation text's first blocks")
    plot_loss_by_length(by_length, figures_dir / "loss_by_length.png")
    lines += ["## Loss by context length", "",
              "Validation loss of the tokens predicted after reading 1, 2, ... tokens of their block: the "
              "first few characters of a block are guessed almost blind.", "",
              f"![loss by context length]({rel}/loss_by_length.png)", "", "## Samples", ""]
    for row in samples.itertuples():
        lines += [f"Prompt `{row.prompt!r}`:", "", "```", row.prompt + row.sample, "```", ""]
    return lines


def run(task, cfg, data_dir, tokenizer_dir, model_path, metrics_path, samples_path, lengths_path, live_dir,
        report_path, figures_dir, losses_path, page_path=None, card_path=None, scores_path=None):
    """Draw the figures into a fresh directory and write report.md, report.html, card.html, losses.csv and
    valid_score.csv (by default the last three beside report.md) beside their places; then all go into place
    together: an error or Ctrl-C half way (a full disk writing report.md too) leaves the previous report and
    its figures as they were, and a report with fewer figures than the last leaves none of the last's behind."""
    report_path, figures_dir = Path(report_path), Path(figures_dir)
    page_path = Path(page_path or report_path.with_suffix(".html"))
    card_path = card_path or report_path.parent / "card.html"
    scores_path = scores_path or report_path.parent / "valid_score.csv"
    rel = figures_dir.relative_to(report_path.parent)
    if page_path.parent.resolve() != report_path.parent.resolve():
        raise ValueError(f"--page {page_path}: not beside --out {report_path}, whose figures it shows")
    with files.atomic_dir(figures_dir) as drawing:
        report = report_lines(task, cfg, data_dir, tokenizer_dir, model_path, metrics_path, samples_path,
                              lengths_path, Path(live_dir), drawing, rel)
        markdown = "\n".join(report.lines)
        before, after = "\n".join(report.lines[:report.view_at]), "\n".join(report.lines[report.view_at:])
        card = card_html(task, report.summary, headline(get_task(task).HEADLINE, report.metrics))
        files.written_together([
            (losses_path, lambda tmp: losses_table(read_curves(Path(live_dir))).to_csv(tmp, index=False)),
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


def valid_score_table(live_dir: Path, module) -> pd.DataFrame:
    """valid_score.csv, the plot of the validation score (step, [epoch,] score): the task's ``VALID_SCORE``
    logged after each epoch (a translation task), or the validation loss (an LM). No rows: none was logged
    (train.valid_score false)."""
    name = getattr(module, "VALID_SCORE", "loss")
    curves = read_curves(live_dir, (f"valid/{name}", "epoch"))
    curve = curves[f"valid/{name}"]
    if curve is None:
        return pd.DataFrame(columns=["step", name])
    table = curve[["step", "value"]].rename(columns={"value": name})
    if curves["epoch"] is not None:
        epochs = curves["epoch"][["step", "value"]].rename(columns={"value": "epoch"})
        table = table.merge(epochs, on="step", how="left")[["step", "epoch", name]]
    return table


def report_lines(task, cfg, data_dir, tokenizer_dir, model_path, metrics_path, samples_path, lengths_path,
                 live_dir: Path, figures_dir: Path, rel: Path) -> Report:
    """report.md's lines, drawing its figures into ``figures_dir``, which the report links as ``rel``, and the
    attention view of report.html."""
    module = get_task(task)
    metrics, samples = read_metrics(metrics_path), read_samples(samples_path, module.KIND)
    by_length = read_lengths(lengths_path)
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
    scores = valid_score_table(live_dir, module)
    if "epoch" in scores.columns and len(scores):
        plot_valid_score(scores, module.VALID_SCORE, figures_dir / "valid_score.png")
        best = scores.loc[scores[module.VALID_SCORE].idxmax()]
        lines += ["## Validation score by epoch", "",
                  f"The task's score of the greedy outputs of the validation split after each epoch ("
                  f"{module.VALID_SCORE}; train.valid_score), best {best[module.VALID_SCORE]:.4f} after epoch "
                  f"{int(best['epoch'])}. It can keep rising after the validation loss stops falling.", "",
                  f"![validation score by epoch]({rel}/valid_score.png)", ""]
    view_at = len(lines)
    if module.KIND == "lm":
        lines += lm_sections(cfg, data_dir, tokenizers, model, samples, by_length, figures_dir, rel,
                             state["block_size"])
        view = lm_view(model, tokenizers.target, read_text(data_dir, "valid"), cfg.passage_tokens)
    else:
        lines += seq2seq_sections(module, cfg, data_dir, tokenizers, model, metrics, samples, by_length,
                                  figures_dir, rel)
        view = seq2seq_view(model, tokenizers, samples)
    return Report(lines, view_at, view, metrics, scores, model_line(state))
