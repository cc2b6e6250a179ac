"""What report.html's attention view shows: every kind, layer and head of attention for a few dozen examples,
rounded to hundredths, as the page's JSON; and what each head does over a whole split (``head_summary``).

The weights come from the model's own forward, teacher-forced on the greedy output (a translation task), so
that each decoder row is the step that chose its token, as in report.md's heatmaps.
"""

import json

import pandas as pd
import torch

from lib.data.pairs import collate
from lib.report.attention_maps import attention_maps, token_strings, visible
from lib.data.tokenizer import encode_pairs, encode_text, special_ids
from lib.evaluate.decode import cut_to_fit

VIEW_EXAMPLES = 32  # at most: the first test examples and the worst, alternately
VIEW_BYTES = 2_000_000  # the JSON's cap: examples are added while it stays under (docs/report.md)
SUMMARY_BATCH = 64  # examples per forward when summarising a split

# The model's kinds of attention (as lib.report.figures.attention_maps and lib.use.inference name them): the view's name
# for each, and what its rows and columns are (token lists of each example).
KINDS = {"encoder self-attention": ("encoder self", "source", "source"),
         "decoder self-attention": ("decoder self", "output", "decoder input"),
         "cross-attention": ("cross", "output", "source"),
         "self-attention": ("self", "text", "text")}
SEQ2SEQ = ("encoder self-attention", "decoder self-attention", "cross-attention")


def kinds_of(names) -> dict:
    """The view's kinds, each with the names of its rows' and columns' token lists."""
    return {KINDS[name][0]: {"rows": KINDS[name][1], "cols": KINDS[name][2]} for name in names}


def hundredths(weights: torch.Tensor) -> list:
    """Weights in [0, 1] as integer hundredths: a tenth of the JSON that floats would take."""
    return (weights.float() * 100).round().to(torch.int16).tolist()


def fits(examples: list[dict], example: dict, size: int) -> tuple[bool, int]:
    grown = size + len(json.dumps(example, ensure_ascii=False, separators=(",", ":"))) + 1
    return grown <= VIEW_BYTES or not examples, grown  # the first always goes in


def chosen_examples(samples: pd.DataFrame) -> pd.DataFrame:
    """The test samples the view offers: the first and the worst wrong ones (by the task's score), alternately."""
    test = samples[samples["split"] == "test"]
    worst = test[~test["correct"].astype(bool)].sort_values("score", kind="stable")
    order = [i for pair in zip(test.index, worst.index) for i in pair]
    order += list(test.index[len(worst):]) + list(worst.index[len(test):])  # the longer list's rest
    return test.loc[list(dict.fromkeys(order))[:VIEW_EXAMPLES]]


@torch.no_grad()
def seq2seq_view(model, tokenizers, samples: pd.DataFrame) -> dict:
    """The view's data: each chosen example's tokens and, per kind, its weights [layer][head][row][col]."""
    ids = special_ids(tokenizers)
    chosen = chosen_examples(samples)
    pairs, _ = cut_to_fit(encode_pairs(tokenizers, pd.DataFrame({"src": chosen["source"].tolist(),
                                                                 "tgt": chosen["greedy"].fillna("").tolist()})),
                          model.cfg.max_len)  # a long test sentence as the model read it
    examples, size, layers, heads = [], 0, 0, 0
    for i, row in enumerate(chosen.itertuples()):
        batch = collate(pairs, [i], ids)
        maps, _ = attention_maps(model, batch, ids)
        S, T = len(pairs.src[i]), len(pairs.tgt[i]) + 1
        tokens = {"source": token_strings(tokenizers.source, batch.src[0, :S]),
                  "decoder input": token_strings(tokenizers.target, batch.tgt_in[0, :T]),
                  "output": token_strings(tokenizers.target, batch.tgt_out[0, :T])}
        shape = {"source": S, "decoder input": T, "output": T}
        example = {"title": f"test {row.Index + 1}{'' if row.correct else ' (wrong)'}: {row.source}",
                   "text": {"source": row.source, "reference": row.reference, "output": row.greedy},
                   "tokens": tokens,
                   "weights": {kind: [hundredths(w[0, :, :shape[rows], :shape[cols]]) for w in maps[name]]
                               for name, (kind, rows, cols) in KINDS.items() if name in SEQ2SEQ}}
        ok, grown = fits(examples, example, size)
        if not ok:
            break
        examples, size = examples + [example], grown
        layers, heads = len(maps["cross-attention"]), maps["cross-attention"][0].size(1)
    return {"kinds": kinds_of(SEQ2SEQ), "layers": layers, "heads": heads, "examples": examples}


@torch.no_grad()
def lm_view(model, tokenizer, text: str, passage_tokens: int) -> dict:
    """The LM's view: consecutive passages of the validation text, ``passage_tokens`` each."""
    ids = encode_text(tokenizer, text)
    examples, size, layers, heads = [], 0, 0, 0
    for start in range(0, min(len(ids), VIEW_EXAMPLES * passage_tokens) - passage_tokens + 1, passage_tokens):
        passage = ids[start:start + passage_tokens]
        _, weights = model.forward_with_attention(passage[None])
        labels = [visible(token) for token in token_strings(tokenizer, passage)]
        example = {"title": f"validation tokens {start + 1}-{start + len(passage)}",
                   "text": {"passage": tokenizer.decode(passage.tolist())}, "tokens": {"text": labels},
                   "weights": {"self": [hundredths(w[0]) for w in weights]}}
        ok, grown = fits(examples, example, size)
        if not ok:
            break
        examples, size = examples + [example], grown
        layers, heads = len(weights), weights[0].size(1)
    return {"kinds": kinds_of(["self-attention"]), "layers": layers, "heads": heads, "examples": examples}


def served_view(attentions: dict, title: str, text: dict[str, str]) -> dict:
    """The view's data for one text from ``lib.use.inference``'s ``attention()`` (kind -> Attention: layers, rows,
    cols), as the served model's page shows it."""
    tokens, weights = {}, {}
    for name, attention in attentions.items():
        kind, rows, cols = KINDS[name]
        tokens[rows], tokens[cols] = attention.rows, attention.cols
        weights[kind] = [hundredths(w) for w in attention.layers]
    first = next(iter(attentions.values())).layers
    return {"kinds": kinds_of(attentions), "layers": len(first), "heads": first[0].size(0),
            "examples": [{"title": title, "text": text, "tokens": tokens, "weights": weights}]}


def head_statistics(weights: torch.Tensor, rows: torch.Tensor, sink: torch.Tensor) -> dict:
    """Sums over the real rows of a batch's weights (B, H, Q, K) of one layer: each head's entropy, weight on
    the same position, on the previous one and on ``sink`` (B,) (the source's <eos>, or the first position);
    ``rows`` (B,): the real queries (masked keys carry no weight). Returns per-head sums (H,) and the row count."""
    B, H, Q, K = weights.shape
    real = (torch.arange(Q)[None] < rows[:, None]).float()[:, None, :]  # (B, 1, Q)
    entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1)  # (B, H, Q)
    q = torch.arange(Q)
    same = torch.where(q < K, weights[..., q, q.clamp(max=K - 1)], 0.0)  # (B, H, Q)
    previous = torch.where((q >= 1) & (q - 1 < K), weights[..., q, (q - 1).clamp(0, K - 1)], 0.0)
    previous[..., 0] = 0.0
    on_sink = weights.gather(-1, sink[:, None, None, None].expand(B, H, Q, 1))[..., 0]
    return {"entropy": (entropy * real).sum((0, 2)), "same": (same * real).sum((0, 2)),
            "previous": (previous * real).sum((0, 2)), "sink": (on_sink * real).sum((0, 2)),
            "rows": real.sum()}


def summary_frame(totals: dict[tuple[str, int], dict]) -> pd.DataFrame:
    """One row per (kind, layer, head): the means over every real row of the split."""
    rows = []
    for (kind, layer), sums in totals.items():
        for head in range(len(sums["entropy"])):
            rows.append({"kind": kind, "layer": layer + 1, "head": head + 1,
                         **{name: float(sums[name][head] / sums["rows"])
                            for name in ("entropy", "same", "previous", "sink")}})
    return pd.DataFrame(rows)


def accumulate(totals: dict, key, stats: dict):
    if key in totals:
        totals[key] = {name: totals[key][name] + value for name, value in stats.items()}
    else:
        totals[key] = stats


@torch.no_grad()
def seq2seq_summary(model, tokenizers, frame: pd.DataFrame) -> pd.DataFrame:
    """Each head over the split ``frame`` (src, tgt), teacher-forced on the references."""
    ids = special_ids(tokenizers)
    pairs, _ = cut_to_fit(encode_pairs(tokenizers, frame), model.cfg.max_len)
    totals = {}
    for first in range(0, len(frame), SUMMARY_BATCH):
        indices = list(range(first, min(first + SUMMARY_BATCH, len(frame))))
        batch = collate(pairs, indices, ids)
        maps, _ = attention_maps(model, batch, ids)
        S = torch.tensor([len(pairs.src[i]) for i in indices])
        T = torch.tensor([len(pairs.tgt[i]) + 1 for i in indices])
        shapes = {"encoder self-attention": (S, S - 1), "decoder self-attention": (T, torch.zeros_like(T)),
                  "cross-attention": (T, S - 1)}  # the real rows, and the sink: the source's <eos>, or <bos>
        for name, (rows, sink) in shapes.items():
            for layer, weights in enumerate(maps[name]):
                accumulate(totals, (KINDS[name][0], layer), head_statistics(weights, rows, sink))
    return summary_frame(totals)


@torch.no_grad()
def lm_summary(model, tokenizer, text: str, block_size: int, blocks: int = SUMMARY_BATCH) -> pd.DataFrame:
    """Each head over the first ``blocks`` consecutive blocks of the validation text."""
    ids = encode_text(tokenizer, text)
    n = min(blocks, len(ids) // block_size)
    batch = ids[:n * block_size].view(n, block_size)
    _, weights = model.forward_with_attention(batch)
    full, first = torch.full((n,), block_size), torch.zeros(n, dtype=torch.long)
    totals = {}
    for layer, w in enumerate(weights):
        accumulate(totals, (KINDS["self-attention"][0], layer), head_statistics(w, full, first))
    return summary_frame(totals)


SUMMARY_COLUMNS = {"entropy": "entropy (nats)", "same": "on the same position", "previous": "on the previous one",
                   "sink": "on the sink"}


def summary_lines(summary: pd.DataFrame, sink: str, split: str) -> list[str]:
    """report.md's section: a table per kind of attention, a row per layer and head."""
    lines = ["## What each head does", "",
             f"Means over every position of the {split}: the entropy of a position's attention (0: all its weight "
             "on one token; ln of the tokens it reads: spread evenly), and the share of its weight on the same "
             f"position (the diagonal), on the previous position, and on the sink, {sink}. A head with most of its "
             "weight on the diagonal or the previous position is positional; one on the sink is mostly idle.", ""]
    for kind, table in summary.groupby("kind", sort=False):
        shown = table.drop(columns="kind").rename(columns=SUMMARY_COLUMNS)
        shown[list(SUMMARY_COLUMNS.values())] = shown[list(SUMMARY_COLUMNS.values())].map("{:.2f}".format)
        lines += [f"### {kind.capitalize()}-attention", "", shown.to_markdown(index=False, disable_numparse=True), ""]
    return lines
