"""Attention masks, built in one place with one convention.

A mask is boolean, True = may attend, and broadcasts to (B, H, Tq, Tk):
B batch, H heads, Tq query length, Tk key length.
"""

import torch


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Keys that are real tokens: (B, Tk) ids -> (B, 1, 1, Tk)."""
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, Tk)


def causal_mask(length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Position t may attend to positions <= t: (1, 1, T, T), lower triangle True."""
    ones = torch.ones(length, length, dtype=torch.bool, device=device)
    return torch.tril(ones)[None, None]  # (1, 1, T, T)


def target_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Decoder self-attention: real keys at or before the query, (B, 1, T, T)."""
    return padding_mask(tokens, pad_id) & causal_mask(tokens.size(1), tokens.device)
