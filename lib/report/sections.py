"""The report's sections by the task's kind: attention heatmaps of test examples, the scores by length, the
length study's breaking point, accuracy by target value, and the first and worst examples (seq2seq); the loss
by context length and the samples (the LM)."""

import json
from pathlib import Path

import pandas as pd
import torch

from lib.report.attention_view import lm_summary, seq2seq_summary, summary_lines
from lib.data.pairs import collate, read_split, read_text
from lib.report.attention_maps import attention_maps, token_strings, visible
from lib.report.figures import (pair_heatmaps, plot_accuracy_by_value, plot_attention_grid, plot_by_length,
                                plot_loss_by_length, plot_score_by_length)
from lib.evaluate.by_length import lengths_as_numbers
from lib.report.length_study import accuracy_by_value, breaking_length
from lib.report.pages import code_block, literal, literal_frame, metric_name
from lib.tasks.base import Task
from lib.data.tokenizer import encode_pairs, encode_text, special_ids
from lib.evaluate.decode import cut_to_fit

def breaking_section(chosen: Task, model, tokenizers, by_length: dict, samples: pd.DataFrame, trained: tuple[int, int],
                     figures_dir: Path, rel: Path) -> list[str]:
    """The first wrong sequence of the length where the model breaks (``breaking_length``), with
    the attention that wrote its greedy output: the model teacher-forced on that output, so that each
    decoder row is the step that chose its token."""
    lines = ["## Where it breaks", ""]
    length = breaking_length(by_length)
    if length is None:
        return lines + ["Every sequence of every length studied comes out exact.", ""]
    study = samples[samples["split"] == chosen.extra_split]
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
    share = lengths_as_numbers(by_length)[length]
    lines += [f"At length {length}, exact match is {share:.2f} (the model trained on lengths {trained[0]}-"
              f"{trained[1]}). The first wrong sequence of that length:", "",
              pd.DataFrame({"": ["source", "reference", "greedy output"],
                            "tokens": [literal(example.source), literal(example.reference),
                                       literal(example.greedy) if example.greedy else "(empty)"]}
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


def dropped_section(data_dir: Path, state: dict, metrics: dict) -> list[str]:
    """What never reached the model whole: the training pairs prepare's cleaning dropped (cleaning.json, by
    rule), those train skipped as longer than model.max_len, and the test sources cut to it. None: no lines."""
    lines = []
    cleaning = Path(data_dir) / "cleaning.json"
    if cleaning.is_file():
        for split, counts in json.loads(cleaning.read_text()).items():
            if sum(counts["dropped"].values()):
                reasons = ", ".join(f"{n:,} {why}" for why, n in counts["dropped"].items() if n)
                lines.append(f"- prepare dropped {counts['read'] - counts['kept']:,} of {counts['read']:,} {split} "
                             f"pairs ({reasons}; {cleaning})")
    for split, n in state.get("skipped_too_long", {}).items():
        if n:
            lines.append(f"- train skipped {n:,} {split} pairs longer than model.max_len (train.too_long: skip)")
    if metrics.get("n_test_cut"):
        lines.append(f"- {metrics['n_test_cut']:,} of {metrics['n_test']:,} test sources are longer than "
                     "model.max_len: decoded from their first max_len tokens, scored against the whole reference")
    return ["## Data left out", "", *lines, ""] if lines else []


def seq2seq_sections(chosen: Task, cfg, data_dir, tokenizers, model, metrics, samples, by_length: pd.DataFrame,
                     figures_dir: Path, rel: Path):
    """The sections of a seq2seq task's report, with the score by length its evaluate stage wrote (cumsum's
    exact match by digits, multi30k's BLEU by source words)."""
    ids = special_ids(tokenizers)
    pairs, _ = cut_to_fit(encode_pairs(tokenizers, read_split(data_dir, "test").head(cfg.n_attention_examples)),
                          model.cfg.max_len)  # the drawn ones, as the model read them
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
    if chosen.extra_split:
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
        lines += breaking_section(chosen, model, tokenizers, shares, samples, trained, figures_dir,
                                  rel)
    if chosen.numeric_targets:
        lines += value_section(accuracy_by_value(samples, read_split(data_dir, "train")), figures_dir, rel)
    if "group" in by_length.columns:  # the task's score by source length (multi30k's BLEU)
        name = by_length.columns[-1]
        shown = metric_name(name)
        plot_score_by_length(dict(zip(by_length["group"], by_length[name])),
                             dict(zip(by_length["group"], by_length["sentences"])),
                             figures_dir / f"{name}_by_length.png", name)
        lines += [f"## {shown} by source length", "",
                  f"Greedy {'sacreBLEU' if name == 'bleu' else shown} of the test sentences, grouped by the length "
                  "of their source in words (n: the sentences in a group).", "",
                  f"![{shown} by source length]({rel}/{name}_by_length.png)", ""]
    lines += summary_lines(seq2seq_summary(model, tokenizers, read_split(data_dir, "test")),
                           "the source's <eos> (decoder self-attention: <bos>)", "test split, teacher-forced")
    columns = ["source", "reference", "greedy", *[c for c in samples.columns if c.startswith("beam")], "correct"]
    lines += ["## First test examples", "", literal_frame(samples[samples["first"]][columns]).to_markdown(index=False),
              ""]
    # The worst the evaluate stage kept, by the task's score: only the wrong outputs among them
    worst = samples[samples["worst"] & ~samples["correct"].astype(bool)].sort_values("score", kind="stable")
    lines += ["## Worst test examples", "", literal_frame(worst[columns]).to_markdown(index=False) if len(worst) else
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
        lines += [f"Prompt {literal(repr(row.prompt))}:", "", *code_block(row.prompt + row.sample), ""]
    return lines
