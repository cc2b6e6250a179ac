"""Eq. 1 and the multi-head projections in their fast form; held equal to transformer.attention by
tests/test_fast.py. Dims as there; G = H / Hkv query heads per key/value head. Where no caller reads the
weights (training, plain decoding) off the CPU, eq. 1 is torch's fused kernel."""

import torch
import torch.nn.functional as F
from torch import nn

from transformer.attention import MultiHeadAttention
from transformer.fast.eager import eager_on_cpu
from transformer.masks import check_mask


def grouped_attention(q, k, v, mask=None, dropout: nn.Module | None = None, bias=None):
    """``transformer.attention.attention`` as two batched products over each key/value head's group.

    A group's G query heads are stacked as G * Tq rows against its one key head, so shared keys and values
    are read as they are, never copied per query head; the scale and the bias go inside ``baddbmm``.
    """
    B, H, Tq, D = q.shape
    Hkv = k.size(1)
    if H % Hkv:
        raise ValueError(f"{H} query heads cannot share {Hkv} key/value heads evenly")
    G = H // Hkv
    if mask is not None:
        check_mask(mask, (B, H, Tq, k.size(2)))
        # The most negative finite value, not -inf: a fully masked row softmaxes to a uniform row, zeroed below.
        masked = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, torch.finfo(q.dtype).min)
        bias = masked if bias is None else bias + masked
    q3, k3 = q.reshape(B * Hkv, G * Tq, D), k.reshape(B * Hkv, -1, D)  # (B*Hkv, G*Tq, D), (B*Hkv, Tk, D)
    if bias is None:
        scores = torch.baddbmm(q3.new_zeros(()), q3, k3.transpose(1, 2), beta=0.0, alpha=D**-0.5)
    else:
        scores = torch.baddbmm(_grouped(bias, B, H, G, Tq), q3, k3.transpose(1, 2), alpha=D**-0.5)
    scores = scores.view(B, H, Tq, -1)  # (B, H, Tq, Tk)
    weights = F.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, Tq, Tk)
    if mask is not None:
        no_key = ~mask.any(dim=-1, keepdim=True)  # (B or 1, 1, Tq or 1, 1)
        # A CPU skips the pass when no row is fully masked; on a GPU (or compiled) asking would stall the host.
        if not eager_on_cpu(weights) or no_key.any():
            weights = weights.masked_fill(no_key, 0.0)
    attended = weights if dropout is None else dropout(weights)
    out = torch.bmm(attended.reshape(B * Hkv, G * Tq, -1), v.reshape(B * Hkv, -1, D))  # (B*Hkv, G*Tq, D)
    return out.view(B, H, Tq, D), weights  # (B, H, Tq, D), (B, H, Tq, Tk)


def fused_attention(q, k, v, mask=None, dropout_p: float = 0.0, bias=None) -> torch.Tensor:
    """Eq. 1 by ``F.scaled_dot_product_attention`` (flash or memory-efficient kernels on a GPU), which never
    makes the weights: (B, H, Tq, D). A query with no key to attend to gets zeros, as in the reference."""
    B, H, Tq, D = q.shape
    no_key = None
    if mask is not None:
        check_mask(mask, (B, H, Tq, k.size(2)))
        no_key = ~mask.any(dim=-1, keepdim=True)  # (B or 1, 1 or H, Tq or 1, 1)
        mask = mask | no_key  # such a row attends to every key, then is zeroed: no NaN forward or backward
        if bias is not None:
            mask = torch.where(mask, bias, torch.finfo(q.dtype).min)
    elif bias is not None:
        mask = bias
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=k.size(1) != H)
    return out if no_key is None else out.masked_fill(no_key, 0.0)


def _grouped(bias: torch.Tensor, B: int, H: int, G: int, Tq: int) -> torch.Tensor:
    """A bias broadcastable to (B, H, Tq, Tk), laid out as the grouped scores: (B*H/G or 1, G*Tq or 1, Tk)."""
    bias = bias.reshape((1,) * (4 - bias.dim()) + bias.shape)  # (B or 1, H or 1, Tq or 1, Tk)
    Tk = bias.size(3)
    if bias.size(0) == bias.size(1) == 1:  # the same for every batch and head: broadcast it
        if G > 1 and bias.size(2) > 1:  # each query head of a group takes its own Tq rows
            bias = bias.expand(1, G, Tq, Tk)
        return bias.reshape(1, -1, Tk)
    return bias.expand(B, H, Tq, Tk).reshape(B * H // G, G * Tq, Tk)


class FastMultiHeadAttention(MultiHeadAttention):
    """The same parameters as ``MultiHeadAttention``; fused projections laid out in one copy, grouped attention."""

    def project(self, x: torch.Tensor, memory: torch.Tensor | None):
        if not self.fused_qkv:
            return super().project(x, memory)
        if memory is None and self.n_kv_heads == self.n_heads:
            B, T, C = x.shape
            # One copy lays out the heads of q, k and v contiguously, where splitting each would copy three times.
            qkv = self.qkv_proj(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, D)
            return qkv.contiguous().unbind(0)
        if memory is None:
            q, k, v = self.qkv_proj(x).split([self.q_width, self.kv_width, self.kv_width], dim=-1)
            return self.split_heads(q), self.split_heads(k), self.split_heads(v)
        q, (k, v) = self.query(x), self._fused_rows(memory, slice(self.q_width, None)).chunk(2, dim=-1)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        if eager_on_cpu(k):
            # By head once, the copy the grouped products make anyway: a search's cache is then read as it is.
            k, v = k.contiguous(), v.contiguous()
        return q, k, v

    def _fused_rows(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        """x through some rows of the fused projection: the keys' and values' together, one product."""
        b = self.qkv_proj.bias
        return F.linear(x, self.qkv_proj.weight[rows], None if b is None else b[rows])

    def remember(self, cache: dict, k: torch.Tensor, v: torch.Tensor, start: int):
        """With the cache's ``size`` (the most positions a search will feed), keys and values are written in
        place into buffers that long, so that a step copies its own and no earlier ones; without, as the
        reference does."""
        if "size" not in cache:
            return super().remember(cache, k, v, start)
        R, end = k.size(0), start + k.size(2)
        if "k_buffer" not in cache:
            cache["k_buffer"], cache["v_buffer"] = (t.new_empty(R, t.size(1), cache["size"], t.size(3)) for t in (k, v))
        cache["k_buffer"][:R, :, start:end], cache["v_buffer"][:R, :, start:end] = k, v
        cache["k"], cache["v"] = cache["k_buffer"][:R, :, :end], cache["v_buffer"][:R, :, :end]
        return cache["k"], cache["v"]

    def select_cache(self, cache: dict, rows: torch.Tensor):
        """The chosen rows gathered into a second pair of buffers, which then take the first pair's place:
        each step reuses the same two, where the reference allocates anew."""
        if "k_buffer" not in cache:
            return super().select_cache(cache, rows)
        R, end = len(rows), cache["k"].size(2)
        spare = cache.setdefault("spare", [torch.empty_like(cache["k_buffer"]), torch.empty_like(cache["v_buffer"])])
        for name, into in zip("kv", spare):
            torch.index_select(cache[name], 0, rows, out=into[:R, :, :end])
        cache["spare"] = [cache["k_buffer"], cache["v_buffer"]]
        cache["k_buffer"], cache["v_buffer"] = spare
        cache["k"], cache["v"] = spare[0][:R, :, :end], spare[1][:R, :, :end]

    def attend(self, q, k, v, mask, bias, need_weights: bool):
        """The fused kernel off the CPU when nobody reads the weights; on a CPU, the grouped products (with
        byte dropout), which train there as fast."""
        if k.size(0) != q.size(0) and bias is None:
            return self.attend_beams(q, k, v, mask, need_weights)
        if k.size(0) != q.size(0):
            return super().attend(q, k, v, mask, bias, need_weights)
        if need_weights or eager_on_cpu(q):
            return grouped_attention(q, k, v, mask, self.dropout, bias)
        return fused_attention(q, k, v, mask, self.dropout.p if self.training else 0.0, bias), None

    def attend_beams(self, q, k, v, mask, need_weights: bool):
        """Cross attention of a search's K beams (q (b*K, H, Tq, D)) over their sentence's memory (k and v
        (b, Hkv, Tk, D)): the beams' queries as K times as many rows of one sentence, so that its keys are read
        once for all of them, never copied per beam."""
        (R, H, Tq, D), b = q.shape, k.size(0)
        K = R // b
        q = q.view(b, K, H, Tq, D).transpose(1, 2).reshape(b, H, K * Tq, D)
        out, weights = self.attend(q, k, v, mask, None, need_weights)  # mask (b, 1, 1, Tk) fits every row
        out = out.view(b, H, K, Tq, D).transpose(1, 2).reshape(R, H, Tq, D)
        if weights is not None:
            weights = weights.view(b, H, K, Tq, -1).transpose(1, 2).reshape(R, H, Tq, -1)
        return out, weights
