"""Decoding: batched greedy and beam search for the encoder-decoder, sampling for the LM.

Every search runs incrementally by default: the decoder keeps each layer's
self-attention keys and values (and the cross-attention ones, computed once
per sentence) in a cache, so a step costs one token's work instead of the
whole prefix's. ``use_cache=False`` re-runs the decoder over the prefix at
every step, as a reference and for the speed benchmark.
Dims: B sentences, K beams, S source length, T tokens so far, V vocabulary.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lib.config import largest_alpha
from lib.data import Pairs, SpecialIds, collate, token_budget_batches
from transformer.masks import padding_mask, target_mask


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # without bos and eos
    score: float  # log_prob / length penalty (see ``length_penalty``): what beam search ranks by
    log_prob: float  # the model's log-probability of the tokens, eos included when it ended with one
    eos: bool  # ended with eos (False: cut at its length limit); the eos is part of the score
    token_log_probs: tuple[float, ...] = ()  # each produced token's, eos included; ``score_outputs`` gives them

    @classmethod
    def of(cls, tokens: list[int], log_prob: float, eos: bool, alpha: float,
           token_log_probs: tuple[float, ...] = ()) -> "Hypothesis":
        """An output with its log-probability, scored as beam search ranks it under length penalty ``alpha``."""
        return cls(tokens, log_prob / length_penalty(len(tokens) + eos, alpha), log_prob, eos, token_log_probs)

    def with_alpha(self, alpha: float) -> "Hypothesis":
        """The same output, scored under another length penalty."""
        return Hypothesis.of(self.tokens, self.log_prob, self.eos, alpha, self.token_log_probs)


def length_penalty(length: torch.Tensor | int, alpha: float):
    """GNMT's ((5 + |Y|) / 6) ** alpha (Wu et al., 2016); |Y| counts the produced tokens, eos included."""
    return ((5 + length) / 6) ** alpha


def check_alpha(model, alpha: float, name: str = "alpha"):
    """A ValueError naming ``alpha`` (as ``name``: a flag, a param) where the length penalty of the model's longest
    output (max_len tokens) overflows float32: beam search would rank -inf / inf, a NaN, above every real candidate."""
    longest = model.cfg.max_len
    if not torch.isfinite(length_penalty(torch.tensor(longest), alpha)):
        raise ValueError(f"{name} {alpha}: the length penalty ((5 + length) / 6) ** alpha overflows at this model's "
                         f"longest output ({longest} tokens) for an alpha above {largest_alpha(longest):.1f} "
                         "(GNMT's: 0.6 to 1)")


def check_eval_mode(model):
    """Refuse a model left in training mode with dropout on: every step of a search or score would then be drawn
    from a randomly thinned model, a different output each call and a worse one, and nothing would say so."""
    if model.training and any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        raise ValueError("the model is in training mode, so its dropout would thin it at every step: call "
                         "model.eval() before searching, sampling or scoring (and model.train() to train on)")


class Decoder:
    """One encoded batch, stepped token by token: logits for the next token of every row."""

    def __init__(self, model, src: torch.Tensor, ids: SpecialIds, use_cache: bool, repeat: int = 1):
        check_eval_mode(model)
        self.model, self.ids, self.use_cache = model, ids, use_cache
        src_mask = padding_mask(src, ids.pad)  # (B, 1, 1, S)
        memory, _ = model.encode(src, src_mask)  # (B, S, C)
        # Beams: K copies of each sentence, sentence-major (row b * K + k).
        self.memory, self.src_mask = memory.repeat_interleave(repeat, 0), src_mask.repeat_interleave(repeat, 0)
        self.cache = model.new_cache() if use_cache else None

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """out (R, T) the tokens so far (bos first) -> next-token logits (R, V)."""
        if self.use_cache:  # only the newest token goes in; the cache holds the rest
            start = out.size(1) - 1
            hidden, _ = self.model.decode(out[:, -1:], self.memory, None, self.src_mask, self.cache, start)
        else:
            hidden, _ = self.model.decode(out, self.memory, target_mask(out, self.ids.pad), self.src_mask)
        return self.model.generator(hidden[:, -1]).float()  # (R, V)

    def reorder(self, rows: torch.Tensor):
        """Keep rows ``rows`` (R,) of the self-attention cache: the beams that survived a step.

        Cross-attention keys stay: every beam of a sentence has the same ones.
        """
        if self.cache is not None:
            for layer in self.cache:
                layer["self"]["k"] = layer["self"]["k"].index_select(0, rows)
                layer["self"]["v"] = layer["self"]["v"].index_select(0, rows)


def _never_pad_or_bos(scores: torch.Tensor, ids: SpecialIds) -> torch.Tensor:
    """scores (R, V), in place: neither pad nor bos can be chosen as a next token. Applied after any
    normalisation, so that the other tokens keep the log-probabilities teacher forcing gives them."""
    scores[:, [ids.pad, ids.bos]] = float("-inf")
    return scores


def _limits(model, src: torch.Tensor, max_new_tokens: torch.Tensor) -> torch.Tensor:
    return max_new_tokens.clamp(max=model.cfg.max_len - 1).to(src.device)


def _strip(row: list[int], ids: SpecialIds) -> list[int]:
    """Tokens up to the first eos or pad."""
    tokens = []
    for token in row:
        if token in (ids.eos, ids.pad):
            break
        tokens.append(token)
    return tokens


@torch.no_grad()
def greedy_search(model, src: torch.Tensor, ids: SpecialIds, max_new_tokens: torch.Tensor, alpha: float = 0.0,
                  use_cache: bool = True) -> list[Hypothesis]:
    """Most likely next token at each step (never pad or bos), for a batch at once.

    src (B, S) ids; max_new_tokens (B,) the most tokens each sentence may
    produce, eos included (and never past the model's max_len). A sentence
    stops at eos or at its limit; the loop stops when all have. Returns each
    sentence's output with its score as beam search would report it (the
    log-probabilities of the chosen tokens add up as they are chosen).
    """
    B = src.size(0)
    decoder = Decoder(model, src, ids, use_cache)
    limit = _limits(model, src, max_new_tokens)
    out = torch.full((B, 1), ids.bos, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    ended_with_eos = torch.zeros(B, dtype=torch.bool, device=src.device)
    log_prob = torch.zeros(B, device=src.device)
    for t in range(int(limit.max())):
        step = _never_pad_or_bos(F.log_softmax(decoder.logits(out), dim=-1), ids)  # (B, V)
        best, next_token = step.max(dim=-1)  # (B,) each
        log_prob += best.masked_fill(finished, 0.0)
        next_token = next_token.masked_fill(finished, ids.pad)
        out = torch.cat([out, next_token[:, None]], dim=1)  # (B, T + 1)
        ended_with_eos |= next_token == ids.eos
        finished |= (next_token == ids.eos) | (t + 1 >= limit)
        if finished.all():
            break
    tokens, eos = [_strip(row, ids) for row in out[:, 1:].tolist()], ended_with_eos.tolist()
    return [Hypothesis.of(row, lp, e, alpha) for row, lp, e in zip(tokens, log_prob.tolist(), eos)]


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
    limit = _limits(model, src, max_new_tokens).repeat_interleave(K)  # (B*K,)
    out = torch.full((B * K, 1), ids.bos, dtype=torch.long, device=device)  # (B*K, 1)
    log_prob = torch.zeros(B, K, device=device)
    log_prob[:, 1:] = float("-inf")  # all beams start equal: let only the first one expand
    log_prob = log_prob.view(-1)  # (B*K,)
    length = torch.zeros(B * K, dtype=torch.long, device=device)  # tokens produced, eos included
    finished = torch.zeros(B * K, dtype=torch.bool, device=device)
    ended_with_eos = torch.zeros(B * K, dtype=torch.bool, device=device)
    for _ in range(int(limit.max())):
        step = _never_pad_or_bos(F.log_softmax(decoder.logits(out), dim=-1), ids)  # (B*K, V)
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
        results.append([Hypothesis(_strip(tokens[b * K + k], ids), scores[b, k].item(), log_prob[b * K + k].item(),
                                   eos[b * K + k]) for k in order[:n_best] if scores[b, k].isfinite()])
    return results


def _source_batches(model, sources: list[list[int]], ids: SpecialIds, max_tokens: int, max_extra_tokens: int):
    """(indices, src (B, S), limit (B,)) for each batch of sources, on the model's device."""
    device = next(model.parameters()).device
    pairs = Pairs(sources, [[] for _ in sources])
    for indices in token_budget_batches(pairs, max_tokens):
        src = collate(pairs, indices, ids).src.to(device)  # (B, S)
        yield indices, src, (src != ids.pad).sum(dim=1) + max_extra_tokens


def translate(model, sources: list[list[int]], ids: SpecialIds, max_tokens: int, max_extra_tokens: int,
              beam_size: int = 0, alpha: float = 0.0, use_cache: bool = True) -> list[list[int]]:
    """The best output ids for every source, in order: greedy (beam_size 0 or 1) or beam search.

    Sources are batched by length within ``max_tokens``; each may produce its
    length + ``max_extra_tokens`` tokens (eos included).
    """
    return [hypotheses[0].tokens for hypotheses in translate_n_best(
        model, sources, ids, max_tokens, max_extra_tokens, beam_size, alpha, use_cache=use_cache)]


def translate_n_best(model, sources: list[list[int]], ids: SpecialIds, max_tokens: int, max_extra_tokens: int,
                     beam_size: int, alpha: float = 0.0, n_best: int = 1,
                     use_cache: bool = True) -> list[list[Hypothesis]]:
    """Beam search's ``n_best`` hypotheses for every source, in order, best first, with their scores.

    beam_size 1 is greedy search, which beam search of one beam equals; it runs as ``greedy_search``,
    the cheaper of the two.
    """
    check_alpha(model, alpha)
    outputs: list[list[Hypothesis]] = [[] for _ in sources]
    for indices, src, limit in _source_batches(model, sources, ids, max_tokens, max_extra_tokens):
        if beam_size > 1:
            found = beam_search(model, src, ids, limit, beam_size, alpha, n_best, use_cache)
        else:
            found = [[h] for h in greedy_search(model, src, ids, limit, alpha, use_cache)]
        for i, hypotheses in zip(indices, found):
            outputs[i] = hypotheses
    return outputs


@torch.no_grad()
def score_outputs(model, sources: list[list[int]], outputs: list[list[int]], ids: SpecialIds, max_tokens: int,
                  alpha: float = 0.0, eos: list[bool] | None = None) -> list[Hypothesis]:
    """What beam search reports for each output of its source, computed by teacher forcing, in batches of at
    most ``max_tokens`` tokens a side. ``eos``: whether each output ended with eos (default: all did); the
    eos's log-probability counts only where it did."""
    check_eval_mode(model)
    check_alpha(model, alpha)
    eos = [True] * len(outputs) if eos is None else eos
    device = next(model.parameters()).device
    pairs = Pairs(sources, outputs)
    scored: dict[int, Hypothesis] = {}
    for indices in token_budget_batches(pairs, max_tokens):
        batch = collate(pairs, indices, ids).to(device)  # tgt_out: each output + eos, then pad
        logits = model(batch.src, batch.tgt_in, padding_mask(batch.src, ids.pad), target_mask(batch.tgt_in, ids.pad))
        log_probs = F.log_softmax(logits.float(), dim=-1).gather(2, batch.tgt_out[..., None])[..., 0]  # (B, T)
        log_probs = log_probs.cpu()  # one transfer a batch, not one a sentence
        for row, i in enumerate(indices):
            produced = log_probs[row, :len(outputs[i]) + eos[i]]  # the tokens produced, eos included
            scored[i] = Hypothesis.of(outputs[i], produced.sum().item(), eos[i], alpha, tuple(produced.tolist()))
    return [scored[i] for i in range(len(outputs))]


@torch.no_grad()
def sampled(
    model,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    generator: torch.Generator,
    block_size: int,
    top_p: float = 1.0,
    use_cache: bool = True,
) -> Iterator[int]:
    """Continue ``prompt`` by sampling from the LM, one token at a time: yields each new token as it is drawn.

    Logits are divided by ``temperature``; with ``top_k`` > 0 only the k
    likeliest tokens may be drawn, with ``top_p`` < 1 only the smallest set
    whose probabilities reach p (nucleus sampling). The model sees at most the
    last ``block_size`` tokens: the cache serves until the text fills the
    block; past it, the window slides and every position moves, so each step
    recomputes the window. ``generator`` (on the CPU) makes it reproducible.
    """
    check_eval_mode(model)
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)  # (1, T)
    cache, fed = (model.new_cache(), 0) if use_cache else (None, 0)
    # Divided with their largest made 0, by no less than float32's smallest normal: a temperature near 0 then
    # sends the others to -inf (a greedy step), not the largest to inf or 0 / 0 (NaN after softmax).
    divisor = max(temperature, torch.finfo(torch.float32).tiny)
    for _ in range(max_new_tokens):
        if cache is not None and ids.size(1) <= block_size:
            logits = model(ids[:, fed:], cache, fed)[0, -1]  # the tokens not yet in the cache
            fed = ids.size(1)
        else:
            logits = model(ids[:, -block_size:])[0, -1]  # (V,)
        logits = logits.float()
        logits = (logits - logits.max()) / divisor
        logits = top_p_filter(top_k_filter(logits, top_k), top_p)
        next_token = torch.multinomial(torch.softmax(logits, dim=-1).cpu(), 1, generator=generator)
        yield next_token.item()
        ids = torch.cat([ids, next_token.to(device)[None]], dim=1)  # (1, T + 1)


def sample(model, prompt: list[int], max_new_tokens: int, temperature: float, top_k: int,
           generator: torch.Generator, block_size: int, top_p: float = 1.0, use_cache: bool = True) -> list[int]:
    """``sampled``'s tokens all at once: the prompt followed by the new tokens."""
    return prompt + list(sampled(model, prompt, max_new_tokens, temperature, top_k, generator, block_size, top_p,
                                 use_cache))


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th included), -inf elsewhere; k = 0 keeps all."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the likeliest tokens until their probabilities sum to at least p, -inf elsewhere; p = 1 keeps all."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # the mass of the tokens ranked above each one
    drop_sorted = before >= p  # the first token always stays (before = 0)
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
