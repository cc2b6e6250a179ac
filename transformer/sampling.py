"""Sampling from the decoder-only LM: temperature, top-k and nucleus (top-p) filtering, a token at a time."""

from collections.abc import Iterator

import torch

from transformer.decoding import check_eval_mode


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
