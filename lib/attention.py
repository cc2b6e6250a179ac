"""Scaled dot-product and multi-head attention (Vaswani et al., 2017, sec. 3.2),
with the relative position schemes that act inside attention: RoPE (Su et al.,
2021) rotates queries and keys, ALiBi (Press et al., 2022) biases the scores.

Dims: B batch, H heads, Tq query length, Tk key length, C model width,
D head width (C = H * D), Hkv key/value heads (H for the paper's attention;
fewer, each shared by a group of G = H / Hkv query heads, for grouped-query).
"""

import torch
import torch.nn.functional as F
from torch import nn

from lib.dropout import Dropout, eager_on_cpu


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(D) + bias) V, eq. 1 of the paper (bias: ALiBi's).

    q (B, H, Tq, D), k and v (B, Hkv, Tk, D): Hkv = H, or fewer key/value heads
    each shared by G = H / Hkv consecutive query heads (grouped-query attention;
    one, multi-query). mask boolean, True = may attend, of 4 dimensions each
    (B, H, Tq, Tk)'s size or 1 (lib.masks); bias an additive float tensor
    broadcastable to the scores. Returns the output (B, H, Tq, D) and the
    weights (B, H, Tq, Tk) before dropout. Masked keys get
    exactly zero weight; a row with no allowed key gets all-zero weights (and a
    zero output), not NaN.
    """
    B, H, Tq, D = q.shape
    Hkv = k.size(1)
    if H % Hkv:
        raise ValueError(f"{H} query heads cannot share {Hkv} key/value heads evenly")
    G = H // Hkv
    if mask is not None:
        _check_mask(mask, (B, H, Tq, k.size(2)))
        # The most negative finite value rather than -inf: a fully masked row then
        # softmaxes to a uniform row instead of NaN, zeroed below; in any other row a
        # masked key's weight underflows to exactly 0.
        masked = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, torch.finfo(q.dtype).min)
        bias = masked if bias is None else bias + masked
    # One batched product per (batch, key/value head): scores = bias + Q K^T / sqrt(D), the bias
    # added and the scale applied inside the matmul rather than in passes of their own. A group's
    # G query heads are stacked as G * Tq rows against its one key head, so that the shared keys
    # and values are read as they are, never copied once per query head.
    q3, k3 = q.reshape(B * Hkv, G * Tq, D), k.reshape(B * Hkv, -1, D)
    if bias is None:
        scores = torch.baddbmm(q3.new_zeros(()), q3, k3.transpose(1, 2), beta=0.0, alpha=D**-0.5)
    else:
        scores = torch.baddbmm(_grouped(bias, B, H, G, Tq), q3, k3.transpose(1, 2), alpha=D**-0.5)
    scores = scores.view(B, H, Tq, -1)  # (B, H, Tq, Tk)
    # Softmax in float32 so that low-precision autocast stays numerically safe.
    weights = F.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, Tq, Tk)
    if mask is not None:
        no_key = ~mask.any(dim=-1, keepdim=True)  # (B or 1, 1, Tq or 1, 1): cheap, mask is small
        # A CPU skips the pass when no row is fully masked (the usual case). On a GPU the
        # question alone would stall the host until the device caught up, twelve times a
        # step in a 3 + 3 layer model: the pass is the cheaper of the two there. A compiled
        # model (train.compile) makes the pass too: a branch on data would split its graph.
        if not eager_on_cpu(weights) or no_key.any():
            weights = weights.masked_fill(no_key, 0.0)
    attended = weights if dropout is None else dropout(weights)
    out = torch.bmm(attended.reshape(B * Hkv, G * Tq, -1), v.reshape(B * Hkv, -1, D))  # (B*Hkv, G*Tq, D)
    return out.view(B, H, Tq, D), weights  # (B, H, Tq, D), (B, H, Tq, Tk)


def _check_mask(mask: torch.Tensor, scores: tuple[int, int, int, int]):
    """Refuse a mask that would not mean what it says. Broadcasting alone would take a (B, Tk) padding mask
    as (Tq, Tk) rows, one batch row's padding for each query, whenever B happened to equal Tq (or 1)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"attention mask of dtype {mask.dtype}: it must be boolean, True where a query may attend "
                        "(an additive mask of 0 and -inf, as torch's attn_mask takes, goes in bias)")
    if mask.dim() != 4 or any(m not in (1, n) for m, n in zip(mask.shape, scores)):
        raise ValueError(f"attention mask of shape {tuple(mask.shape)} does not fit the scores' (B, H, Tq, Tk) = "
                         f"{scores}: it needs 4 dimensions, each that size or 1, as lib.masks makes them "
                         "(padding_mask: (B, 1, 1, Tk); causal_mask: (1, 1, Tq, Tk); target_mask: (B, 1, Tq, Tk))")


def _grouped(bias: torch.Tensor, B: int, H: int, G: int, Tq: int) -> torch.Tensor:
    """A bias broadcastable to (B, H, Tq, Tk), laid out as the grouped scores: (B*H/G or 1, G*Tq or 1, Tk)."""
    bias = bias.reshape((1,) * (4 - bias.dim()) + bias.shape)  # (B or 1, H or 1, Tq or 1, Tk)
    Tk = bias.size(3)
    if bias.size(0) == bias.size(1) == 1:  # the same for every batch and head: broadcast it
        if G > 1 and bias.size(2) > 1:  # each query head of a group takes its own Tq rows
            bias = bias.expand(1, G, Tq, Tk)
        return bias.reshape(1, -1, Tk)
    return bias.expand(B, H, Tq, Tk).reshape(B * H // G, G * Tq, Tk)


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
        # In x's precision: under bf16 autocast, float32 tables would make float32 copies of every query
        # and key (9% of the Shakespeare LM's forward and backward), which the attention's matmul casts back.
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


class MultiHeadAttention(nn.Module):
    """Project to H heads, attend in each, merge and project back (sec. 3.2.2).

    With ``fused_qkv`` the three input projections are one matrix: self
    attention then needs a single matmul; cross attention uses its query rows
    on the decoder states and its key/value rows on the encoder output.
    ``n_kv_heads`` below H projects fewer key and value heads, each shared by a
    group of query heads (grouped-query attention, Ainslie et al., 2023; one:
    multi-query, Shazeer, 2019): the key/value cache shrinks by H / n_kv_heads.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, fused_qkv: bool = True,
                 positional: str = "sinusoidal", max_len: int = 0, bias: bool = True, rope_base: float = 10000.0,
                 n_kv_heads: int = 0):
        """``positional`` rope or alibi acts here, in self and cross attention alike: in
        cross attention it compares the decoder position with the source position, a
        prior for monotonic alignment. Other values leave positions to the embeddings.
        ``n_kv_heads`` 0 (or H): a key and value head per query head, as in the paper."""
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        n_kv_heads = n_kv_heads or n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads {n_heads} is not divisible by n_kv_heads {n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.fused_qkv = fused_qkv
        self.rotary = RotaryEmbedding(self.head_dim, max_len, rope_base) if positional == "rope" else None
        if positional == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(n_heads), persistent=False)
        else:
            self.alibi_slopes = None
        self.kv_width = n_kv_heads * self.head_dim  # C, or less for grouped-query attention
        if fused_qkv:  # rows: the queries' C, then the keys' and the values' kv_width each
            self.qkv_proj = nn.Linear(d_model, d_model + 2 * self.kv_width, bias=bias)
        else:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.k_proj = nn.Linear(d_model, self.kv_width, bias=bias)
            self.v_proj = nn.Linear(d_model, self.kv_width, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = Dropout(dropout)

    def _project(self, x: torch.Tensor, memory: torch.Tensor | None):
        """Queries from x; keys and values from memory (cross) or x (self): (B, H or Hkv, T*, D) each."""
        if not self.fused_qkv:
            kv = x if memory is None else memory
            return tuple(self._split_heads(t) for t in (self.q_proj(x), self.k_proj(kv), self.v_proj(kv)))
        if memory is None and self.n_kv_heads == self.n_heads:
            B, T, C = x.shape
            # One copy lays out the heads of q, k and v contiguously, (3, B, H, T, D), where
            # splitting each of them would copy three times (and three times in backward).
            qkv = self.qkv_proj(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            return qkv.contiguous().unbind(0)
        if memory is None:
            q, k, v = self.qkv_proj(x).split([x.size(-1), self.kv_width, self.kv_width], dim=-1)
        else:
            q, (k, v) = self._query(x), self._fused_rows(memory, slice(x.size(-1), None)).chunk(2, dim=-1)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused_qkv:
            return self.q_proj(x)
        return self._fused_rows(x, slice(None, x.size(-1)))

    def _fused_rows(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        """x through some rows of the fused projection: the query rows, or the key/value rows."""
        b = self.qkv_proj.bias
        return F.linear(x, self.qkv_proj.weight[rows], None if b is None else b[rows])

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H or Hkv, T, D)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: dict | None = None,
        start: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, Tq, C); memory (B, Tk, C) for cross attention, None for self.

        Incremental decoding: x holds the tokens at positions start..start+Tq-1 and
        ``cache`` (a dict this layer fills) the keys and values computed before:
        self attention appends the new ones, cross attention projects ``memory``
        once and reuses it (Hkv heads each). Returns the output (B, Tq, C) and the weights (B, H, Tq, Tk).
        """
        B, Tq, C = x.shape
        q_positions = torch.arange(start, start + Tq, device=x.device)
        if memory is not None and cache is not None and "k" in cache:  # cross attention, keys cached
            q, k, v = self._split_heads(self._query(x)), cache["k"], cache["v"]
            if self.rotary is not None:
                q = self.rotary(q, q_positions)
        else:
            q, k, v = self._project(x, memory)  # (B, H, Tq, D), (B, Hkv, Tk, D) twice
            if self.rotary is not None:
                q = self.rotary(q, q_positions)
                k = self.rotary(k, q_positions if memory is None else torch.arange(k.size(2), device=k.device))
            if cache is not None:
                if memory is None and "k" in cache:  # self attention: the new keys follow the cached ones
                    k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        Tk = k.size(2)
        bias = None if self.alibi_slopes is None else alibi_bias(self.alibi_slopes, Tq, Tk, start).to(q.dtype)
        out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout, bias)  # (B, H, Tq, D)
        out = out.transpose(1, 2).reshape(B, Tq, C)  # (B, Tq, C)
        return self.out_proj(out), weights
