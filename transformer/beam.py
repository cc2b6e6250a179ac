"""Beam search (sec. 6.1): the K best-scoring continuations of each sentence, under GNMT's length penalty.

Dims: B sentences, K beams, V vocabulary.
"""

import torch
import torch.nn.functional as F

from transformer.config import SpecialIds
from transformer.greedy import Decoder, Hypothesis, length_penalty, limits, never_pad_or_bos, strip


@torch.no_grad()
def beam_search(model, src: torch.Tensor, ids: SpecialIds, max_new_tokens: torch.Tensor, beam_size: int,
                alpha: float = 0.0, n_best: int = 1, use_cache: bool = True) -> list[list[Hypothesis]]:
    """The ``beam_size`` best-scoring continuations of each sentence, all sentences and beams at once.

    A hypothesis's score is its log-probability under the model divided by
    ``length_penalty(length, alpha)``; candidates are ranked by that score at
    every step, so alpha > 0 stops favouring short outputs. A beam that emits
    eos (or reaches its sentence's limit, as in ``greedy_search``) is finished:
    it keeps its slot and score, continuing with pad at no cost. The search
    stops when every beam of every sentence has finished. Returns, per
    sentence, the ``n_best`` hypotheses, best first. With beam_size 1 it is
    greedy search.
    """
    B, K = src.size(0), beam_size
    device = src.device
    decoder = Decoder(model, src, ids, use_cache, repeat=K)
    limit = limits(model, src, max_new_tokens).repeat_interleave(K)  # (B*K,)
    out = torch.full((B * K, 1), ids.bos, dtype=torch.long, device=device)  # (B*K, 1)
    log_prob = torch.zeros(B, K, device=device)
    log_prob[:, 1:] = float("-inf")  # all beams start equal: let only the first one expand
    log_prob = log_prob.view(-1)  # (B*K,)
    length = torch.zeros(B * K, dtype=torch.long, device=device)  # tokens produced, eos included
    finished = torch.zeros(B * K, dtype=torch.bool, device=device)
    ended_with_eos = torch.zeros(B * K, dtype=torch.bool, device=device)
    for _ in range(int(limit.max())):
        step = never_pad_or_bos(F.log_softmax(decoder.logits(out), dim=-1), ids)  # (B*K, V)
        V = step.size(-1)
        # A finished beam has one continuation, pad, that changes nothing.
        step[finished] = float("-inf")
        step[finished, ids.pad] = 0.0
        new_length = length + (~finished)  # (B*K,)
        total = log_prob[:, None] + step  # (B*K, V)
        ranked = (total / length_penalty(new_length, alpha)[:, None]).view(B, K * V)
        top = ranked.topk(K, dim=1).indices  # (B, K): beam * V + token
        rows = (torch.arange(B, device=device)[:, None] * K + top // V).view(-1)  # (B*K,) the parent rows
        token = (top % V).view(-1)  # (B*K,)
        log_prob = total.view(B, K * V).gather(1, top).view(-1)
        was_finished = finished[rows]
        length = new_length[rows]
        ended_with_eos = ended_with_eos[rows] | (~was_finished & (token == ids.eos))
        finished = was_finished | (token == ids.eos) | (length >= limit)
        out = torch.cat([out[rows], token[:, None]], dim=1)  # (B*K, T + 1)
        decoder.reorder(rows)
        if finished.all():
            break
    scores = (log_prob / length_penalty(length, alpha)).view(B, K)
    tokens, eos = out[:, 1:].tolist(), ended_with_eos.tolist()
    results = []
    for b in range(B):
        order = scores[b].argsort(descending=True, stable=True).tolist()
        results.append([Hypothesis(strip(tokens[b * K + k], ids), scores[b, k].item(), log_prob[b * K + k].item(),
                                   eos[b * K + k]) for k in order[:n_best] if scores[b, k].isfinite()])
    return results
