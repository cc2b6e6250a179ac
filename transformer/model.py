"""The Transformer of Vaswani et al. (2017), fig. 1, and a decoder-only language model, built from the
blocks of transformer.layers; ``build_model`` makes either.

Dims: B batch, S source length, T target length, C model width, V vocabulary, H heads.
"""

import torch
from torch import nn

from transformer.config import ModelConfig
from transformer.fast import speed_up
from transformer.layers import DecoderLayer, Embedding, EncoderLayer, layer_norm
from transformer.masks import causal_mask


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

    def encode(self, src, src_mask, need_weights: bool = False):
        """src (B, S) ids -> memory (B, S, C) and per-layer weights [(B, H, S, S)] (None each unless
        ``need_weights``)."""
        x = self.src_embed(src)
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, src_mask, need_weights=need_weights)
            weights.append(w)
        return self.encoder_norm(x), weights

    def decode(self, tgt, memory, tgt_mask, src_mask, cache: list[dict] | None = None, start: int = 0,
               need_weights: bool = False):
        """tgt (B, T) ids -> hidden (B, T, C), per-layer [(self (B, H, T, T), cross (B, H, T, S))] (None each
        unless ``need_weights``).

        Incremental decoding: ``cache`` from ``new_cache`` holds what the earlier
        steps computed; tgt is then only the new tokens, at positions from ``start``.
        """
        x = self.tgt_embed(tgt, start)
        weights = []
        for i, layer in enumerate(self.decoder_layers):
            x, self_w, cross_w = layer(x, memory, tgt_mask, src_mask, None if cache is None else cache[i], start,
                                       need_weights)
            weights.append((self_w, cross_w))
        return self.decoder_norm(x), weights

    def new_cache(self, size: int | None = None) -> list[dict]:
        """An empty key/value cache: per decoder layer, self and cross attention's. ``size``: the most positions
        it will hold, for the fast modules to set aside at once (transformer.fast.attention)."""
        return [{"self": {} if size is None else {"size": size}, "cross": {}} for _ in self.decoder_layers]

    def select_cache(self, cache: list[dict], rows: torch.Tensor, sentences: torch.Tensor | None = None):
        """Keep rows ``rows`` of the self-attention caches (a search's surviving hypotheses), and rows
        ``sentences`` of the cross-attention ones (those of the sentences still searched)."""
        for layer, entry in zip(self.decoder_layers, cache):
            layer.self_attn.select_cache(entry["self"], rows)
            if sentences is not None:
                layer.cross_attn.select_cache(entry["cross"], sentences)

    def forward(self, src, tgt, src_mask, tgt_mask, project: bool = True):
        """Teacher-forced logits (B, T, V); with ``project`` False the decoder's output
        (B, T, C) instead, for a loss that applies the generator itself (``transformer.fast.loss``)."""
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
        # Small token vectors, as GPT-2 and nanoGPT start them: Xavier's, scaled by sqrt(d_model), would
        # outweigh the residual stream, and a tied output layer would then predict each input token again.
        nn.init.normal_(self.embed.tokens.weight, std=0.02)
        if cfg.tie_embeddings:
            self.generator.weight = self.embed.tokens.weight

    def forward_with_attention(self, ids, cache: list[dict] | None = None, start: int = 0,
                               need_weights: bool = True):
        """ids (B, T) -> logits (B, T, V) and per-layer weights [(B, H, T, start + T)] (None each unless
        ``need_weights``).

        Incremental decoding: ``cache`` from ``new_cache`` holds the keys and values
        of the ``start`` tokens before ids.
        """
        x = self.embed(ids, start)
        mask = causal_mask(ids.size(1), ids.device, start)  # (1, 1, T, start + T)
        weights = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask, None if cache is None else cache[i], start, need_weights)
            weights.append(w)
        return self.generator(self.norm(x)), weights

    def forward(self, ids, cache: list[dict] | None = None, start: int = 0):
        """ids (B, T) -> logits (B, T, V); no attention weights are made."""
        return self.forward_with_attention(ids, cache, start, False)[0]

    def new_cache(self) -> list[dict]:
        """An empty key/value cache, one dict per layer."""
        return [{} for _ in self.layers]


def build_model(cfg: ModelConfig, kind: str, src_vocab_size: int, tgt_vocab_size: int, joint_vocab: bool,
                fast: bool = False) -> nn.Module:
    """The model a task needs: ``kind`` "seq2seq" or "lm" (which uses the target vocabulary).
    ``fast``: the same parameters, run by the modules of transformer.fast."""
    if kind == "seq2seq":
        model = Transformer(cfg, src_vocab_size, tgt_vocab_size, joint_vocab)
    elif kind == "lm":
        model = TransformerLM(cfg, tgt_vocab_size)
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    return speed_up(model) if fast else model


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
