"""Greedy decoding (sec. 6.1's search with one beam): the likeliest next token at each step, over the stepper that
every search shares (transformer.decoding). Dims: B sentences, S source length, T tokens so far, V vocabulary."""

import torch
import torch.nn.functional as F

from transformer.config import SpecialIds
from transformer.decoding import Decoder, Hypothesis, limits, never_pad_or_bos, strip


@torch.no_grad()
def greedy_search(model, src: torch.Tensor, ids: SpecialIds, max_new_tokens: torch.Tensor, alpha: float = 0.0,
                  use_cache: bool = True) -> list[Hypothesis]:
    """Most likely next token at each step (never pad or bos), for a batch at once.

    src (B, S) ids; max_new_tokens (B,) the most tokens each sentence may
    produce, eos included (and never past the model's max_len). A sentence
    stops at eos or at its limit and leaves the batch; the loop stops when all
    have. Returns each sentence's output with its score as beam search would
    report it (the log-probabilities of the chosen tokens add up as they are
    chosen).
    """
    B = src.size(0)
    limit = limits(model, src, max_new_tokens)  # (R,) for the R sentences still decoded
    decoder = Decoder(model, src, ids, use_cache, longest=int(limit.max()))
    sentence = torch.arange(B)  # (R,) which sentence each row decodes
    out = torch.full((B, 1), ids.bos, dtype=torch.long, device=src.device)  # (R, T)
    log_prob = torch.zeros(B, device=src.device)  # (R,)
    found: list[Hypothesis | None] = [None] * B
    for t in range(int(limit.max())):
        step = never_pad_or_bos(F.log_softmax(decoder.logits(out), dim=-1), ids)  # (R, V)
        best, next_token = step.max(dim=-1)  # (R,) each
        log_prob += best
        out = torch.cat([out, next_token[:, None]], dim=1)  # (R, T + 1)
        eos = next_token == ids.eos
        done = eos | (t + 1 >= limit)
        if done.any():
            for b, row, lp, e in zip(sentence[done.cpu()].tolist(), out[done, 1:].tolist(), log_prob[done].tolist(),
                                     eos[done].tolist()):
                found[b] = Hypothesis.of(strip(row, ids), lp, e, alpha)
            rows = (~done).nonzero()[:, 0]  # (R',)
            if not len(rows):
                break
            sentence, out, log_prob, limit = sentence[rows.cpu()], out[rows], log_prob[rows], limit[rows]
            decoder.select(rows, sources_too=True)
    return found
