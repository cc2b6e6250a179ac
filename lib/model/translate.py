"""Greedy translation of many sources, batched by a token budget: what training's per-epoch score decodes with."""


from lib.data.pairs import Pairs, SpecialIds, collate, token_budget_batches
from transformer.greedy import greedy_search


def source_batches(model, sources: list[list[int]], ids: SpecialIds, max_tokens: int, max_extra_tokens: int):
    """(indices, src (B, S), limit (B,)) for each batch of sources, on the model's device: each source may produce
    its length + ``max_extra_tokens`` tokens (eos included)."""
    device = next(model.parameters()).device
    pairs = Pairs(sources, [[] for _ in sources])
    for indices in token_budget_batches(pairs, max_tokens):
        src = collate(pairs, indices, ids).src.to(device)  # (B, S)
        yield indices, src, (src != ids.pad).sum(dim=1) + max_extra_tokens


def greedy_translate(model, sources: list[list[int]], ids: SpecialIds, max_tokens: int, max_extra_tokens: int,
                     use_cache: bool = True) -> list[list[int]]:
    """Greedy search's output ids for every source, in order, sources batched by length within ``max_tokens``."""
    outputs: list[list[int]] = [[] for _ in sources]
    for indices, src, limit in source_batches(model, sources, ids, max_tokens, max_extra_tokens):
        for i, found in zip(indices, greedy_search(model, src, ids, limit, use_cache=use_cache)):
            outputs[i] = found.tokens
    return outputs
