"""The Transformer of Vaswani et al. (2017), fig. 1, and a decoder-only LM.

Read top to bottom: positional encodings, feed-forward, the two layers, the
embeddings, then the two full models sharing those blocks, and ``build_model``.
Dims: B batch, S source length, T target length, C model width, V vocabulary.
"""

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lib.attention import MultiHeadAttention
from lib.config import ModelConfig
from lib.dropout import Dropout
from lib.masks import causal_mask, padding_mask, target_mask

if TYPE_CHECKING:  # the model itself needs no tokenizer
    from lib.tokenizer import SpecialIds


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
        self.dropout = Dropout(dropout)

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
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.fused_qkv, cfg.positional, cfg.max_len,
                              cfg.bias, cfg.rope_base, cfg.n_kv_heads)


def feed_forward(cfg: ModelConfig) -> FeedForward:
    return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.bias, cfg.activation)


def layer_norm(cfg: ModelConfig) -> nn.Module:
    """The residual stream's normalisation: LayerNorm (sec. 3.1), or RMSNorm with ``norm: rmsnorm``."""
    return RMSNorm(cfg.d_model) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.d_model, bias=cfg.bias)


class EncoderLayer(nn.Module):
    """Self attention then feed-forward, each a residual branch with LayerNorm.

    Post-LN (the paper): x = norm(x + sublayer(x)). Pre-LN: x = x + sublayer(norm(x)).
    With a causal mask this is also the decoder-only LM's block.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = attention(cfg)
        self.feed_forward = feed_forward(cfg)
        self.norm1 = layer_norm(cfg)
        self.norm2 = layer_norm(cfg)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: dict | None = None,
                start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, S, C) -> (B, S, C) and the self-attention weights (B, H, S, S).

        ``cache`` and ``start``: incremental decoding (the LM), as in MultiHeadAttention.
        """
        if self.norm_first:
            h, weights = self.self_attn(self.norm1(x), mask=mask, cache=cache, start=start)
            x = x + self.dropout(h)
            x = x + self.dropout(self.feed_forward(self.norm2(x)))
        else:
            h, weights = self.self_attn(x, mask=mask, cache=cache, start=start)
            x = self.norm1(x + self.dropout(h))
            x = self.norm2(x + self.dropout(self.feed_forward(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self attention, cross attention over the encoder output, feed-forward."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = attention(cfg)
        self.cross_attn = attention(cfg)
        self.feed_forward = feed_forward(cfg)
        self.norm1 = layer_norm(cfg)
        self.norm2 = layer_norm(cfg)
        self.norm3 = layer_norm(cfg)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x, memory, tgt_mask, src_mask, cache: dict | None = None, start: int = 0):
        """x (B, T, C), memory (B, S, C) -> (B, T, C), self weights (B, H, T, T),
        cross weights (B, H, T, S). ``cache`` ({"self": {}, "cross": {}}) and ``start``:
        incremental decoding, as in MultiHeadAttention."""
        self_cache, cross_cache = (None, None) if cache is None else (cache["self"], cache["cross"])
        if self.norm_first:
            h, self_weights = self.self_attn(self.norm1(x), mask=tgt_mask, cache=self_cache, start=start)
            x = x + self.dropout(h)
            h, cross_weights = self.cross_attn(self.norm2(x), memory, src_mask, cross_cache, start)
            x = x + self.dropout(h)
            x = x + self.dropout(self.feed_forward(self.norm3(x)))
        else:
            h, self_weights = self.self_attn(x, mask=tgt_mask, cache=self_cache, start=start)
            x = self.norm1(x + self.dropout(h))
            h, cross_weights = self.cross_attn(x, memory, src_mask, cross_cache, start)
            x = self.norm2(x + self.dropout(h))
            x = self.norm3(x + self.dropout(self.feed_forward(x)))
        return x, self_weights, cross_weights


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(C) (sec. 3.4), plus absolute positions, plus dropout.

    sinusoidal and learned positions are added here; rope and alibi act inside
    attention instead, so nothing is added. ``name``: the forward argument the ids come in as, for the message
    about an id outside the vocabulary.
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
        self.dropout = Dropout(cfg.dropout)
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
        """An IndexError naming the first id outside the vocabulary by its row and position, where nn.Embedding says
        "index out of range in self". On the CPU only, where it costs one pass over the ids: on a GPU the check
        would wait for the queued kernels at every forward (CUDA's own device-side assert stops the run there),
        and under torch.compile its branch on the ids' values would break the graph."""
        if ids.device.type != "cpu" or ids.numel() == 0 or torch.compiler.is_compiling():
            return
        low, high = torch.aminmax(ids)
        vocab_size = self.tokens.num_embeddings
        if low.item() < 0 or high.item() >= vocab_size:  # ints: half the time of tensor comparisons
            row, position = ((ids < 0) | (ids >= vocab_size)).nonzero()[0].tolist()
            raise IndexError(f"{self.name}: token id {ids[row, position].item()} at row {row}, position "
                             f"{start + position} is outside the vocabulary (ids 0 to {vocab_size - 1})")


def _xavier_init(module: nn.Module):
    """Xavier-uniform for every matrix, as the Annotated Transformer does."""
    for p in module.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)


class Transformer(nn.Module):
    """Encoder-decoder: encode the source once, decode the target, project to V."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, joint_vocab: bool):
        super().__init__()
        self.cfg = cfg
        self.src_embed = Embedding(src_vocab_size, cfg, "src")
        self.tgt_embed = Embedding(tgt_vocab_size, cfg, "tgt")
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-LN leaves the residual stream unnormalised: one final norm per stack.
        self.encoder_norm = layer_norm(cfg) if cfg.norm_first else nn.Identity()
        self.decoder_norm = layer_norm(cfg) if cfg.norm_first else nn.Identity()
        self.generator = nn.Linear(cfg.d_model, tgt_vocab_size, bias=cfg.bias)
        _xavier_init(self)
        if cfg.tie_embeddings:  # sec. 3.4: one matrix for embeddings and pre-softmax
            self.generator.weight = self.tgt_embed.tokens.weight
            if joint_vocab:
                self.src_embed.tokens.weight = self.tgt_embed.tokens.weight

    def encode(self, src, src_mask):
        """src (B, S) ids -> memory (B, S, C) and per-layer weights [(B, H, S, S)]."""
        x = self.src_embed(src)
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, src_mask)
            weights.append(w)
        return self.encoder_norm(x), weights

    def decode(self, tgt, memory, tgt_mask, src_mask, cache: list[dict] | None = None, start: int = 0):
        """tgt (B, T) ids -> hidden (B, T, C), per-layer [(self (B, H, T, T), cross (B, H, T, S))].

        Incremental decoding: ``cache`` from ``new_cache`` holds what the earlier
        steps computed; tgt is then only the new tokens, at positions from ``start``.
        """
        x = self.tgt_embed(tgt, start)
        weights = []
        for i, layer in enumerate(self.decoder_layers):
            x, self_w, cross_w = layer(x, memory, tgt_mask, src_mask, None if cache is None else cache[i], start)
            weights.append((self_w, cross_w))
        return self.decoder_norm(x), weights

    def new_cache(self) -> list[dict]:
        """An empty key/value cache: per decoder layer, self and cross attention's."""
        return [{"self": {}, "cross": {}} for _ in self.decoder_layers]

    def forward(self, src, tgt, src_mask, tgt_mask, project: bool = True):
        """Teacher-forced logits (B, T, V); with ``project`` False the decoder's output
        (B, T, C) instead, for a loss that applies the generator itself (``generator_nll``)."""
        memory, _ = self.encode(src, src_mask)
        hidden, _ = self.decode(tgt, memory, tgt_mask, src_mask)
        return self.generator(hidden) if project else hidden


class TransformerLM(nn.Module):
    """Decoder-only language model: the encoder block under a causal mask."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(vocab_size, cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.norm = layer_norm(cfg) if cfg.norm_first else nn.Identity()
        self.generator = nn.Linear(cfg.d_model, vocab_size, bias=cfg.bias)
        _xavier_init(self)
        # Small token vectors, as GPT-2 and nanoGPT start them. Xavier's, scaled by sqrt(d_model), outweigh
        # everything else in the residual stream; under a final LayerNorm and a tied output layer each position
        # then predicts its own input token, surely: a first loss near 11 where ln V is 4.2 (shakespeare).
        nn.init.normal_(self.embed.tokens.weight, std=0.02)
        if cfg.tie_embeddings:
            self.generator.weight = self.embed.tokens.weight

    def forward_with_attention(self, ids, cache: list[dict] | None = None, start: int = 0):
        """ids (B, T) -> logits (B, T, V) and per-layer weights [(B, H, T, start + T)].

        Incremental decoding: ``cache`` from ``new_cache`` holds the keys and values
        of the ``start`` tokens before ids.
        """
        x = self.embed(ids, start)
        mask = causal_mask(ids.size(1), ids.device, start)  # (1, 1, T, start + T)
        weights = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask, None if cache is None else cache[i], start)
            weights.append(w)
        return self.generator(self.norm(x)), weights

    def forward(self, ids, cache: list[dict] | None = None, start: int = 0):
        return self.forward_with_attention(ids, cache, start)[0]

    def new_cache(self) -> list[dict]:
        """An empty key/value cache, one dict per layer."""
        return [{} for _ in self.layers]


def build_model(cfg: ModelConfig, kind: str, src_vocab_size: int, tgt_vocab_size: int, joint_vocab: bool):
    """The model a task needs: ``kind`` is "seq2seq" or "lm" (which uses the target vocabulary)."""
    if kind == "seq2seq":
        return Transformer(cfg, src_vocab_size, tgt_vocab_size, joint_vocab)
    if kind == "lm":
        return TransformerLM(cfg, tgt_vocab_size)
    raise ValueError(f"unknown model kind {kind!r}")


# Where a model's parameters sit, by the paper's parts, matched on the names of the modules that hold them.
PARTS = (("positions", "positions"), ("embeddings", "embed"), ("attention", "attn"), ("feed-forward", "feed_forward"),
         ("norms", "norm"), ("output layer", "generator"))


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Trainable parameters by part (``PARTS``, in that order; a part with none left out) and ``total``.

    A tied matrix is one tensor, counted once, under the first module that holds it: the embeddings. So
    a tied output layer adds only its bias; sinusoidal positions, RoPE and ALiBi add none.
    """
    counts = dict.fromkeys((part for part, _ in PARTS), 0)
    for name, p in model.named_parameters():  # each shared tensor once
        modules = name.split(".")[:-1]
        part = next((part for part, key in PARTS if any(key in module for module in modules)), None)
        if part is None:
            raise ValueError(f"parameter {name}: not in any of the parts {[part for part, _ in PARTS]}")
        counts[part] += p.numel()
    counts = {part: n for part, n in counts.items() if n}
    return {**counts, "total": sum(counts.values())}


@torch.no_grad()
def repeats_input(model: nn.Module, ids: "SpecialIds", batch: int = 64, length: int = 16) -> float:
    """The share of positions whose top prediction is the token the model was just given, on random tokens
    other than the tokenizer's special ``ids`` (pad, bos, eos, unk): by chance, 1 / (V - 4).

    Measured on an untrained model: a decoder whose input vectors are also its output layer's rows
    (tie_embeddings), when they outweigh the rest of its residual stream, starts out repeating its input,
    and training first has to undo that (benchmarks/tie_start.py). A generator of its own leaves the
    model's random-number state, and so the training that follows, as they were.
    """
    generator, device = torch.Generator().manual_seed(0), model.generator.weight.device
    length, special = min(length, model.cfg.max_len), {ids.pad, ids.bos, ids.eos, ids.unk}

    def tokens(vocab_size: int) -> torch.Tensor:  # (batch, length) ids, none of them special
        plain = torch.tensor([i for i in range(vocab_size) if i not in special])
        return plain[torch.randint(len(plain), (batch, length), generator=generator)].to(device)

    given = tokens(model.generator.out_features)
    training = model.training
    model.eval()
    if isinstance(model, Transformer):
        src = tokens(model.src_embed.tokens.num_embeddings)
        logits = model(src, given, padding_mask(src, ids.pad), target_mask(given, ids.pad))
    else:
        logits = model(given)
    model.train(training)
    return (logits.argmax(-1) == given).float().mean().item()
