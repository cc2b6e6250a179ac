"""Attention masks, built in one place with one convention.

A mask is boolean, True = may attend, and broadcasts to (B, H, Tq, Tk):
B batch, H heads, Tq query length, Tk key length.
"""

import torch


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Keys that are real tokens: (B, Tk) ids -> (B, 1, 1, Tk)."""
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, Tk)


def causal_mask(length: int, device: torch.device | str | None = None, start: int = 0) -> torch.Tensor:
    """Position t may attend to positions <= t: (1, 1, T, start + T), lower triangle True.

    ``start``: the queries are positions start..start+T-1 and the keys 0..start+T-1
    (new tokens after ``start`` cached ones).
    """
    ones = torch.ones(length, start + length, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=start)[None, None]  # (1, 1, T, start + T)


def target_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Decoder self-attention: real keys at or before the query, (B, 1, T, T)."""
    return padding_mask(tokens, pad_id) & causal_mask(tokens.size(1), tokens.device)


def check_mask(mask: torch.Tensor, scores: tuple[int, int, int, int]):
    """Refuse a mask that would not mean what it says: broadcasting alone would take a (B, Tk) padding mask
    as (Tq, Tk) rows, one batch row's padding for each query, whenever B happened to equal Tq (or 1)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"attention mask of dtype {mask.dtype}: it must be boolean, True where a query may attend "
                        "(an additive mask of 0 and -inf, as torch's attn_mask takes, goes in bias)")
    if mask.dim() != 4 or any(m not in (1, n) for m, n in zip(mask.shape, scores)):
        raise ValueError(f"attention mask of shape {tuple(mask.shape)} does not fit the scores' (B, H, Tq, Tk) = "
                         f"{scores}: it needs 4 dimensions, each that size or 1, as transformer.masks makes them "
                         "(padding_mask: (B, 1, 1, Tk); causal_mask: (1, 1, Tq, Tk); target_mask: (B, 1, Tq, Tk))")
