"""Beam search (sec. 6.1): the K best-scoring continuations of each sentence, under GNMT's length penalty.

Dims: B sentences (b of them still searched), K beams, V vocabulary, T the longest output allowed.
"""

import torch
import torch.nn.functional as F

from transformer.config import SpecialIds
from transformer.decoding import Decoder, Hypothesis, length_penalty, limits, never_pad_or_bos, strip


class Finished:
    """Each sentence's K best finished hypotheses so far, best first: scores (b, K), -inf where none yet."""

    def __init__(self, B: int, K: int, T: int, pad: int, device):
        self.score = torch.full((B, K), float("-inf"), device=device)
        self.log_prob = torch.zeros(B, K, device=device)
        self.eos = torch.zeros(B, K, dtype=torch.bool, device=device)
        self.tokens = torch.full((B, K, T + 1), pad, dtype=torch.long, device=device)  # bos first, then pad
        self.pad = pad

    def add(self, score: torch.Tensor, log_prob: torch.Tensor, tokens: torch.Tensor, eos: torch.Tensor):
        """Candidates (b, C) that ended (score -inf: did not), with their tokens (b, C, n + 1): the K best of
        them and of those kept stay."""
        tokens = F.pad(tokens, (0, self.tokens.size(2) - tokens.size(2)), value=self.pad)
        self.score, pick = torch.cat([self.score, score], dim=1).topk(self.score.size(1), dim=1)  # (b, K)
        self.log_prob = torch.cat([self.log_prob, log_prob], dim=1).gather(1, pick)
        self.eos = torch.cat([self.eos, eos], dim=1).gather(1, pick)
        self.tokens = torch.cat([self.tokens, tokens], dim=1).gather(1, pick[..., None].expand(-1, -1, tokens.size(2)))

    def keep(self, rows: torch.Tensor):
        """Only the sentences ``rows`` (b',), in that order."""
        self.score, self.log_prob, self.eos, self.tokens = (t[rows] for t in (self.score, self.log_prob, self.eos,
                                                                              self.tokens))

    def hypotheses(self, rows: torch.Tensor, n_best: int, ids: SpecialIds) -> list[list[Hypothesis]]:
        """The ``n_best`` best of each sentence of ``rows``, best first."""
        score, log_prob, eos = (t[rows, :n_best].tolist() for t in (self.score, self.log_prob, self.eos))
        tokens = self.tokens[rows, :n_best, 1:].tolist()
        return [[Hypothesis(strip(tokens[i][k], ids), score[i][k], log_prob[i][k], eos[i][k])
                 for k in range(len(score[i])) if score[i][k] > float("-inf")] for i in range(len(score))]


def best_reachable(log_prob: torch.Tensor, n: int, limit: torch.Tensor, alpha: float) -> torch.Tensor:
    """The best score a live hypothesis of ``log_prob`` (b,) after n tokens can still reach: its log-probability
    only falls, so it is at most that over the largest penalty of a length from n to ``limit`` (b,)."""
    return log_prob / length_penalty(limit, alpha).clamp(min=length_penalty(n, alpha))


def continuations(live: torch.Tensor, step: torch.Tensor, out: torch.Tensor):
    """The 2K likeliest continuations of each sentence's K live hypotheses (``live``: (b, K) log-probabilities,
    ``step``: (b*K, V) each one's next-token log-probabilities, ``out``: (b*K, n - 1) its tokens): their
    log-probabilities (b, 2K), their parents' rows (b, 2K), their last tokens (b, 2K) and all their tokens
    (b, 2K, n). All have n tokens, so the likeliest are the best-scoring."""
    (b, K), V = live.shape, step.size(-1)
    total = (live.view(-1, 1) + step).view(b, K * V)
    log_prob, top = total.topk(min(2 * K, K * V), dim=1)  # (b, 2K): beam * V + token
    rows = torch.arange(b, device=live.device)[:, None] * K + top // V
    token = top % V
    tokens = torch.cat([out[rows.view(-1)], token.view(-1, 1)], dim=1).view(b, -1, out.size(1) + 1)
    return log_prob, rows, token, tokens


@torch.no_grad()
def beam_search(model, src: torch.Tensor, ids: SpecialIds, max_new_tokens: torch.Tensor, beam_size: int,
                alpha: float = 0.0, n_best: int = 1, use_cache: bool = True) -> list[list[Hypothesis]]:
    """The ``beam_size`` best-scoring continuations of each sentence, all sentences and beams at once.

    A hypothesis's score is its log-probability under the model divided by
    ``length_penalty(length, alpha)``, so alpha > 0 stops favouring short
    outputs. Each sentence keeps K live hypotheses and up to K finished ones.
    At every step the 2K likeliest continuations of its live ones are taken:
    those that end (in eos, or at the sentence's limit as in ``greedy_search``)
    join the finished ones if among the K best, and the K best of the others
    are the new live ones (at most K end, one eos per beam, so K go on).

    A sentence is done, and leaves the batch, when its ``n_best``-th finished
    hypothesis scores at least what its best live one could still reach: a
    log-probability only falls, so that is its log-probability over the
    largest penalty its length can still reach (tensor2tensor's bound). Returns,
    per sentence, the ``n_best`` hypotheses, best first. With beam_size 1 and
    alpha 0 it is greedy search; with alpha > 0 it scores at least as well.
    """
    B, K, n_best = src.size(0), beam_size, min(n_best, beam_size)
    device = src.device
    limit = limits(model, src, max_new_tokens)  # (b,)
    T = int(limit.max())
    decoder = Decoder(model, src, ids, use_cache, repeat=K, longest=T)
    sentence = torch.arange(B)  # (b,) which sentence each one searched is
    out = torch.full((B * K, 1), ids.bos, dtype=torch.long, device=device)  # (b*K, n): each live one's tokens
    live = torch.full((B, K), float("-inf"), device=device)  # (b, K) their log-probabilities
    live[:, 0] = 0.0  # all beams start equal: let only the first one expand
    finished = Finished(B, K, T, ids.pad, device)
    found: list[list[Hypothesis]] = [[] for _ in range(B)]
    for n in range(1, T + 1):  # n: the tokens a hypothesis has produced after this step, eos included
        step = never_pad_or_bos(F.log_softmax(decoder.logits(out), dim=-1), ids)  # (b*K, V)
        log_prob, rows, token, tokens = continuations(live, step, out)
        eos = token == ids.eos
        ends = eos | (n >= limit)[:, None]
        finished.add(log_prob.masked_fill(~ends, float("-inf")) / length_penalty(n, alpha), log_prob, tokens, eos)
        live, pick = log_prob.masked_fill(ends, float("-inf")).topk(K, dim=1)  # (b, K): the best that go on
        rows = rows.gather(1, pick).view(-1)  # (b*K,)
        out = tokens.gather(1, pick[..., None].expand(-1, -1, n + 1)).view(-1, n + 1)  # (b*K, n + 1)
        done = finished.score[:, n_best - 1] >= best_reachable(live[:, 0], n, limit, alpha)  # (b,)
        if not done.any():
            decoder.select(rows)
            continue
        for b_, hypotheses in zip(sentence[done.cpu()].tolist(), finished.hypotheses(done, n_best, ids)):
            found[b_] = hypotheses
        left = (~done).nonzero()[:, 0]  # (b',)
        if not len(left):
            break
        beams = (left[:, None] * K + torch.arange(K, device=device)).view(-1)  # (b'*K,) their rows
        sentence, limit, live, out = sentence[left.cpu()], limit[left], live[left], out[beams]
        finished.keep(left)
        decoder.select(rows[beams], sources_too=True)
    return found
