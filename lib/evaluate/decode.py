"""Searching and scoring many sources for the evaluate stage and for a trained model's users: greedy or beam
search with n-best lists, and teacher-forced scores of given outputs, batched by a token budget."""

import torch
import torch.nn.functional as F

from lib.data.pairs import Pairs, SpecialIds, collate, token_budget_batches
from lib.model.translate import source_batches
from transformer.beam import beam_search
from transformer.decoding import Hypothesis, check_alpha, check_eval_mode
from transformer.greedy import greedy_search
from transformer.masks import padding_mask, target_mask


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

    beam_size 1 runs ``greedy_search``, the cheaper search, which one beam equals without a length penalty.
    """
    check_alpha(model, alpha)
    outputs: list[list[Hypothesis]] = [[] for _ in sources]
    for indices, src, limit in source_batches(model, sources, ids, max_tokens, max_extra_tokens):
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


def cut_to_fit(pairs: Pairs, max_len: int) -> tuple[Pairs, int]:
    """Pairs whose source is cut to ``max_len`` tokens and target to ``max_len`` - 1 (its bos or eos takes the
    last position), and how many pairs were cut: a long test sentence is decoded and scored all the same."""
    cut = sum(width > max_len for width in pairs.widths())
    if not cut:
        return pairs, 0
    return Pairs([list(s[:max_len]) for s in pairs.src], [list(t[:max_len - 1]) for t in pairs.tgt]), cut
