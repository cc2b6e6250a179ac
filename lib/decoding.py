"""Decoding a trained encoder-decoder: batched greedy search.

Dims: B sentences, S source length, T tokens produced so far.
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
