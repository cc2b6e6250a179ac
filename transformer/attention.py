"""Scaled dot-product attention (eq. 1) and multi-head attention (sec. 3.2).

Dims: B batch, H heads, Tq query length, Tk key length, C model width, D head
width (C = H * D), Hkv key/value heads (H in the paper; fewer for grouped-query
attention, each shared by H / Hkv query heads).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer.masks import check_mask
from transformer.positions import RotaryEmbedding, alibi_bias, alibi_slopes


def attention(q, k, v, mask=None, dropout=None, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(D)) V, eq. 1; ``bias`` (ALiBi's) is added to the scores.

    q (B, H, Tq, D); k and v (B, Hkv, Tk, D); mask boolean, True = may attend, 4 dims broadcastable to
    (B, H, Tq, Tk). Returns the output (B, H, Tq, D) and the weights (B, H, Tq, Tk) before dropout.
    A query with no key to attend to gets all-zero weights, not NaN.
    """
    B, H, Tq, D = q.shape
    if H % k.size(1):
        raise ValueError(f"{H} query heads cannot share {k.size(1)} key/value heads evenly")
    k = k.repeat_interleave(H // k.size(1), dim=1)  # (B, H, Tk, D): grouped-query heads share keys
    v = v.repeat_interleave(H // v.size(1), dim=1)  # (B, H, Tk, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        check_mask(mask, tuple(scores.shape))
        scores = scores.masked_fill(~mask, float("-inf"))
    # In float32, safe under bf16 autocast; a row whose keys are all masked is NaN there, made zeros.
    weights = F.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(q.dtype)  # (B, H, Tq, Tk)
    out = (weights if dropout is None else dropout(weights)) @ v  # (B, H, Tq, D)
    return out, weights


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Self attention takes queries, keys and values from x; cross attention its keys and values from the
    encoder's output. ``fused_qkv``: W^Q, W^K and W^V are the row blocks of one matrix. ``n_kv_heads``
    below H: grouped-query attention (Ainslie et al., 2023; one head: multi-query, Shazeer, 2019).
    ``positional`` rope or alibi acts here, in self and cross attention alike. ``d_head``: each head's width
    D (None: d_model / n_heads, the paper's); the heads' concatenation, H * D wide, is projected back to d_model.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, fused_qkv: bool = True,
                 positional: str = "sinusoidal", max_len: int = 0, bias: bool = True, rope_base: float = 10000.0,
                 n_kv_heads: int = 0, d_head: int | None = None):
        super().__init__()
        if not d_head and d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        n_kv_heads = n_kv_heads or n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads {n_heads} is not divisible by n_kv_heads {n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_head or d_model // n_heads
        self.q_width = n_heads * self.head_dim  # H * D: C, unless d_head sets D
        self.fused_qkv = fused_qkv
        self.rotary = RotaryEmbedding(self.head_dim, max_len, rope_base) if positional == "rope" else None
        if positional == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(n_heads), persistent=False)
        else:
            self.alibi_slopes = None
        self.kv_width = n_kv_heads * self.head_dim  # q_width, or less for grouped-query attention
        if fused_qkv:  # rows: the queries' q_width, then the keys' and the values' kv_width each
            self.qkv_proj = nn.Linear(d_model, self.q_width + 2 * self.kv_width, bias=bias)
        else:
            self.q_proj = nn.Linear(d_model, self.q_width, bias=bias)
            self.k_proj = nn.Linear(d_model, self.kv_width, bias=bias)
            self.v_proj = nn.Linear(d_model, self.kv_width, bias=bias)
        self.out_proj = nn.Linear(self.q_width, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def projections(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(W^Q, b^Q), (W^K, b^K), (W^V, b^V): three layers' weights, or the row blocks of the fused one."""
        if not self.fused_qkv:
            return [(p.weight, p.bias) for p in (self.q_proj, self.k_proj, self.v_proj)]
        rows = [self.q_width, self.kv_width, self.kv_width]
        b = self.qkv_proj.bias
        return list(zip(self.qkv_proj.weight.split(rows), (None,) * 3 if b is None else b.split(rows)))

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H or Hkv, T, D)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """x W^Q: (B, Tq, C)."""
        return F.linear(x, *self.projections()[0])

    def project(self, x: torch.Tensor, memory: torch.Tensor | None):
        """Queries from x, keys and values from memory (cross) or x (self): (B, H or Hkv, T*, D) each."""
        source = x if memory is None else memory
        (wq, bq), (wk, bk), (wv, bv) = self.projections()
        return (self.split_heads(F.linear(x, wq, bq)), self.split_heads(F.linear(source, wk, bk)),
                self.split_heads(F.linear(source, wv, bv)))

    def attend(self, q, k, v, mask, bias, need_weights: bool):
        """Eq. 1 in every head at once: the output and the weights (here made either way). Keys of fewer rows
        than the queries are a search's memory, one row a sentence: each serves its sentence's beams in turn."""
        if k.size(0) != q.size(0):
            beams = q.size(0) // k.size(0)
            k, v = k.repeat_interleave(beams, 0), v.repeat_interleave(beams, 0)
            mask = mask if mask is None or mask.size(0) == 1 else mask.repeat_interleave(beams, 0)
        return attention(q, k, v, mask, self.dropout, bias)

    def remember(self, cache: dict, k: torch.Tensor, v: torch.Tensor, start: int):
        """Self attention's cache: the new keys and values (B, Hkv, Tq, D), at positions from ``start``, follow
        the cached ones. Returns all of them so far, (B, Hkv, start + Tq, D) each."""
        if "k" in cache:
            k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
        cache["k"], cache["v"] = k, v
        return k, v

    def select_cache(self, cache: dict, rows: torch.Tensor):
        """Keep rows ``rows`` (R,) of the cache, in that order: a search's surviving hypotheses."""
        if "k" in cache:
            cache["k"], cache["v"] = cache["k"].index_select(0, rows), cache["v"].index_select(0, rows)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                cache: dict | None = None, start: int = 0,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, Tq, C); memory (B, Tk, C) for cross attention (or (B / K, Tk, C): each row for K beams in
        turn), None for self.

        Incremental decoding: x holds the tokens at positions start..start+Tq-1 and ``cache`` (a dict this
        layer fills) the keys and values computed before: self attention appends the new ones, cross
        attention projects ``memory`` once. Returns the output (B, Tq, C) and, with ``need_weights``, the
        weights (B, H, Tq, Tk), else None: a caller that does not read them lets a fused kernel skip them.
        """
        B, Tq, _ = x.shape
        q_positions = torch.arange(start, start + Tq, device=x.device)
        if memory is not None and cache is not None and "k" in cache:  # cross attention, keys cached
            q, k, v = self.split_heads(self.query(x)), cache["k"], cache["v"]
            if self.rotary is not None:
                q = self.rotary(q, q_positions)
        else:
            q, k, v = self.project(x, memory)  # (B, H, Tq, D), (B, Hkv, Tk, D) twice
            if self.rotary is not None:
                q = self.rotary(q, q_positions)
                k = self.rotary(k, q_positions if memory is None else torch.arange(k.size(2), device=k.device))
            if cache is not None and memory is None:
                k, v = self.remember(cache, k, v, start)
            elif cache is not None:
                cache["k"], cache["v"] = k, v
        Tk = k.size(2)
        bias = None if self.alibi_slopes is None else alibi_bias(self.alibi_slopes, Tq, Tk, start).to(q.dtype)
        out, weights = self.attend(q, k, v, mask, bias, need_weights)  # (B, H, Tq, D), (B, H, Tq, Tk) or None
        out = out.transpose(1, 2).reshape(B, Tq, self.q_width)  # (B, Tq, H * D): the heads concatenated
        return self.out_proj(out), weights if need_weights else None
