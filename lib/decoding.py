"""Decoding: batched greedy search for the encoder-decoder, sampling for the LM.

Dims: B sentences, S source length, T tokens produced so far, V vocabulary.
"""

import torch

from lib.masks import padding_mask, target_mask
from lib.tokenizer import SpecialIds


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, ids: SpecialIds, max_new_tokens: torch.Tensor) -> list[list[int]]:
    """Most likely next token at each step, for a batch at once.

    src (B, S) ids; max_new_tokens (B,) the most tokens each sentence may
    produce, eos included (and never past the model's max_len). A sentence
    stops at eos or at its limit; the loop stops when all have. Returns each
    sentence's ids without bos and eos.
    """
    B = src.size(0)
    src_mask = padding_mask(src, ids.pad)  # (B, 1, 1, S)
    memory, _ = model.encode(src, src_mask)  # (B, S, C)
    limit = max_new_tokens.clamp(max=model.cfg.max_len - 1).to(src.device)
    out = torch.full((B, 1), ids.bos, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    for t in range(int(limit.max())):
        hidden, _ = model.decode(out, memory, target_mask(out, ids.pad), src_mask)  # (B, T, C)
        next_token = model.generator(hidden[:, -1]).argmax(dim=-1)  # (B,)
        next_token = next_token.masked_fill(finished, ids.pad)
        out = torch.cat([out, next_token[:, None]], dim=1)  # (B, T + 1)
        finished |= (next_token == ids.eos) | (t + 1 >= limit)
        if finished.all():
            break
    results = []
    for row in out[:, 1:].tolist():
        tokens = []
        for token in row:
            if token in (ids.eos, ids.pad):
                break
            tokens.append(token)
        results.append(tokens)
    return results


@torch.no_grad()
def sample(
    model,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    generator: torch.Generator,
    block_size: int,
) -> list[int]:
    """Continue ``prompt`` by sampling from the LM, one token at a time.

    Logits are divided by ``temperature``; with ``top_k`` > 0 only the k
    likeliest tokens may be drawn. The model sees at most the last
    ``block_size`` tokens. ``generator`` (on the CPU) makes it reproducible.
    Returns the prompt followed by the new tokens.
    """
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)  # (1, T)
    for _ in range(max_new_tokens):
        logits = model(ids[:, -block_size:])[0, -1] / temperature  # (V,)
        probs = torch.softmax(top_k_filter(logits, top_k).float(), dim=-1).cpu()
        next_token = torch.multinomial(probs, 1, generator=generator).to(device)  # (1,)
        ids = torch.cat([ids, next_token[None]], dim=1)  # (1, T + 1)
    return ids[0].tolist()


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th included), -inf elsewhere; k = 0 keeps all."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))
