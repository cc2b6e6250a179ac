"""The blocks both models are made of (sec. 3.1-3.4): feed-forward, the residual sublayer connection, the
encoder and decoder layers, and the embeddings.

Dims: B batch, S source length, T target length, C model width.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer.attention import MultiHeadAttention
from transformer.config import ModelConfig
from transformer.positions import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied at each position (sec. 3.3).

    ``activation`` gelu puts GELU in place of max(0, .) (as GPT does); swiglu makes the
    inner layer a gated linear unit, swish(x W1) * (x W3) (Shazeer, 2020; Llama's), W1 and
    W3 one (2 d_ff, C) matrix here so that both take one matmul.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool = True, activation: str = "relu"):
        super().__init__()
        self.activation = activation
        self.linear1 = nn.Linear(d_model, 2 * d_ff if activation == "swiglu" else d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear1(x)  # (B, T, d_ff), or (B, T, 2 d_ff) for swiglu
        if self.activation == "swiglu":
            gate, h = h.chunk(2, dim=-1)
            h = F.silu(gate) * h
        else:
            h = F.gelu(h) if self.activation == "gelu" else torch.relu(h)
        return self.linear2(self.dropout(h))


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g (Zhang and Sennrich, 2019): LayerNorm without subtracting
    the mean and without a bias, computed in float32 as autocast computes LayerNorm."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


def attention(cfg: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.weights_dropout, cfg.fused_qkv, cfg.positional,
                              cfg.max_len, cfg.bias, cfg.rope_base, cfg.n_kv_heads, cfg.d_head)


def feed_forward(cfg: ModelConfig) -> FeedForward:
    return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.bias, cfg.activation)


def layer_norm(cfg: ModelConfig) -> nn.Module:
    """The residual stream's normalisation: LayerNorm (sec. 3.1), or RMSNorm with ``norm: rmsnorm``."""
    return RMSNorm(cfg.d_model) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.d_model, bias=cfg.bias)


class ResidualLayer(nn.Module):
    """A layer whose sublayers each sit in a residual connection with a norm and dropout (sec. 3.1, 5.4).

    Post-LN (the paper): x = LayerNorm(x + Dropout(Sublayer(x))). Pre-LN (``norm_first``):
    x = x + Dropout(Sublayer(LayerNorm(x))), the stack then ending in a norm of its own.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_first = cfg.norm_first

    def sublayer(self, x: torch.Tensor, norm: nn.Module, sublayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``sublayer`` maps (B, T, C) to (B, T, C) and its attention weights (or None); both come back."""
        if self.norm_first:
            h, weights = sublayer(norm(x))
            return x + self.dropout(h), weights
        h, weights = sublayer(x)
        return norm(x + self.dropout(h)), weights


class EncoderLayer(ResidualLayer):
    """Self attention then feed-forward, each a residual sublayer (sec. 3.1).

    With a causal mask this is also the decoder-only LM's block.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.self_attn = attention(cfg)
        self.feed_forward = feed_forward(cfg)
        self.norm1 = layer_norm(cfg)
        self.norm2 = layer_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: dict | None = None,
                start: int = 0, need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, S, C) -> (B, S, C) and the self-attention weights (B, H, S, S), or None unless ``need_weights``.

        ``cache`` and ``start``: incremental decoding (the LM), as in MultiHeadAttention.
        """
        x, weights = self.sublayer(x, self.norm1, lambda x: self.self_attn(x, mask=mask, cache=cache, start=start,
                                                                           need_weights=need_weights))
        x, _ = self.sublayer(x, self.norm2, lambda x: (self.feed_forward(x), None))
        return x, weights


class DecoderLayer(ResidualLayer):
    """Masked self attention, cross attention over the encoder output, feed-forward (sec. 3.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.self_attn = attention(cfg)
        self.cross_attn = attention(cfg)
        self.feed_forward = feed_forward(cfg)
        self.norm1 = layer_norm(cfg)
        self.norm2 = layer_norm(cfg)
        self.norm3 = layer_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, memory, tgt_mask, src_mask, cache: dict | None = None, start: int = 0,
                need_weights: bool = False):
        """x (B, T, C), memory (B, S, C) -> (B, T, C), self weights (B, H, T, T),
        cross weights (B, H, T, S) (None each unless ``need_weights``). ``cache`` ({"self": {}, "cross": {}})
        and ``start``: incremental decoding, as in MultiHeadAttention."""
        self_cache, cross_cache = (None, None) if cache is None else (cache["self"], cache["cross"])
        x, self_weights = self.sublayer(
            x, self.norm1, lambda x: self.self_attn(x, mask=tgt_mask, cache=self_cache, start=start,
                                                    need_weights=need_weights))
        x, cross_weights = self.sublayer(
            x, self.norm2, lambda x: self.cross_attn(x, memory, src_mask, cross_cache, start, need_weights))
        x, _ = self.sublayer(x, self.norm3, lambda x: (self.feed_forward(x), None))
        return x, self_weights, cross_weights


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(C) (sec. 3.4), plus absolute positions, plus dropout.

    sinusoidal and learned positions are added here; rope and alibi act inside attention instead.
    ``name``: the forward argument the ids come in as, for the message about an id outside the vocabulary.
    """

    def __init__(self, vocab_size: int, cfg: ModelConfig, name: str = "ids"):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, cfg.d_model)
        self.max_len, self.name = cfg.max_len, name
        if cfg.positional == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(cfg.d_model, cfg.max_len)
        elif cfg.positional == "learned":
            self.positions = LearnedPositionalEmbedding(cfg.d_model, cfg.max_len)
        else:  # rope, alibi: positions act inside attention
            self.positions = None
        self.dropout = nn.Dropout(cfg.dropout)
        self.scale = math.sqrt(cfg.d_model)

    def forward(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """ids (B, T) at positions start..start+T-1 -> (B, T, C)."""
        if start + ids.size(1) > self.max_len:
            raise ValueError(f"sequence length {start + ids.size(1)} exceeds model.max_len {self.max_len} "
                             "in params.yaml")
        self.check_ids(ids, start)
        x = self.tokens(ids) * self.scale
        if self.positions is not None:
            x = self.positions(x, start)
        return self.dropout(x)  # (B, T, C)

    def check_ids(self, ids: torch.Tensor, start: int):
        """An IndexError naming the first id outside the vocabulary by its row and position, where nn.Embedding
        says "index out of range in self". On the CPU only: on a GPU the check would wait for the queued
        kernels (CUDA's device-side assert stops the run there), and torch.compile cannot branch on ids."""
        if ids.device.type != "cpu" or ids.numel() == 0 or torch.compiler.is_compiling():
            return
        low, high = torch.aminmax(ids)
        vocab_size = self.tokens.num_embeddings
        if low.item() < 0 or high.item() >= vocab_size:
            row, position = ((ids < 0) | (ids >= vocab_size)).nonzero()[0].tolist()
            raise IndexError(f"{self.name}: token id {ids[row, position].item()} at row {row}, position "
                             f"{start + position} is outside the vocabulary (ids 0 to {vocab_size - 1})")
