"""Where a token is: sinusoidal encodings (sec. 3.5), learned embeddings (BERT, GPT), and the schemes that act
inside attention: RoPE (Su et al., 2021) rotates queries and keys, ALiBi (Press et al., 2022) biases the scores.

Dims: B batch, H heads, T length, C model width, D head width, L max_len.
"""

import math

import torch
from torch import nn


class SinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/C)), PE(pos, 2i+1) = cos(...), sec. 3.5."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
        inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(position * inv_freq)
        table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
        # Not a parameter and not saved: rebuilt from the config on load.
        self.register_buffer("table", table, persistent=False)  # (L, C)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        return x + self.table[start:start + T]  # (B, T, C)


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position (as in BERT and GPT)."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        return x + self.table(torch.arange(start, start + T, device=x.device))  # (B, T, C)


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each pair of features (2i, 2i+1) by position * base^(-2i/D).

    Rotating queries and keys alike makes q_m . k_n depend on m - n only.
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (D/2,)
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq  # (L, D/2)
        # Each pair's cosine and sine twice, the sine negated on the pair's first feature: the rotation
        # (a, b) -> (a cos - b sin, b cos + a sin) is then x * cos + (x with each pair swapped) * sin.
        sin = angles.sin().repeat_interleave(2, dim=-1)  # (L, D)
        sin[:, 0::2] *= -1
        self.register_buffer("cos", angles.cos().repeat_interleave(2, dim=-1), persistent=False)  # (L, D)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, D) at positions (T,) -> rotated (B, H, T, D)."""
        swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (b0, a0, b1, a1, ...)
        # In x's precision: under bf16 autocast, float32 tables would make float32 copies of every query and key.
        cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)  # (T, D)
        return x * cos + swapped * sin  # (B, H, T, D)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head slopes: the geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^-8 for a
    power-of-two H; otherwise those of the nearest lower power of two, then every other
    slope of the next one (Press et al., 2022, sec. 3)."""

    def geometric(n):
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    power = 2 ** (n_heads.bit_length() - 1)
    slopes = geometric(power) + geometric(2 * power)[0::2][: n_heads - power]
    return torch.tensor(slopes)


def alibi_bias(slopes: torch.Tensor, q_len: int, k_len: int, start: int = 0) -> torch.Tensor:
    """-slope_h * |i - j| for query position i (from ``start``) and key position j: (1, H, Tq, Tk)."""
    # Made where the slopes are: positions made on the CPU for a model on a GPU would not meet its scores.
    queries, keys = torch.arange(start, start + q_len, device=slopes.device), torch.arange(k_len, device=slopes.device)
    distance = (queries[:, None] - keys[None, :]).abs()  # (Tq, Tk)
    return -(slopes[:, None, None] * distance)[None]  # (1, H, Tq, Tk)
