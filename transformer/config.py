"""The model's hyperparameters (sec. 3 and table 3 of the paper), one frozen dataclass.

A bad value raises ConfigError naming the field; the pipeline prefixes the
dotted params.yaml key it came from.
"""

import dataclasses
import math


class ConfigError(ValueError):
    """A params.yaml problem; the message names the dotted key at fault."""


def require(condition: bool, field: str, message: str):
    """Validation step for __post_init__: the caller prefixes the section's key."""
    if not condition:
        raise ConfigError(f"{field}: {message}")


def choose(value: str, field: str, allowed: tuple[str, ...]):
    require(value in allowed, field, f"{value!r} is not one of {', '.join(allowed)}")


MOST_POSITIONS = 1 << 16  # max_len's bound: far past any task here, far below what would not fit in memory


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    d_model: int  # width C of every residual stream
    n_heads: int  # attention heads H; head width D = C / H unless d_head sets it
    encoder_layers: int  # encoder depth (seq2seq only)
    decoder_layers: int  # decoder depth (the LM's depth)
    d_ff: int  # inner width of the position-wise feed-forward
    dropout: float  # on residual branches and embeddings (sec. 5.4), and attention weights unless set below
    norm_first: bool  # False: Post-LN as in the paper; True: Pre-LN plus a final LayerNorm
    tie_embeddings: bool  # share target embedding and generator (and source embedding: one vocab)
    fused_qkv: bool  # one (3C, C) input projection instead of three (C, C)
    max_len: int  # longest sequence the model accepts (and the position tables cover)
    positional: str = "sinusoidal"  # sinusoidal | learned (added to embeddings) | rope | alibi (inside attention)
    # rope only: feature pair i turns by base^(-2i/D) a position; a larger base turns the slow pairs slower.
    rope_base: float = 10000.0
    # Dropout on the feed-forward's inner activation (tensor2tensor's "relu dropout"; not in the paper).
    activation_dropout: float = 0.0
    bias: bool = True  # biases in every linear layer and LayerNorm (the paper's); False as in nanoGPT
    # Key/value heads: 0 (or n_heads) one per query head, as in the paper; fewer, each shared by a group of
    # n_heads / n_kv_heads query heads (grouped-query attention; 1: multi-query), a cache that many times smaller.
    n_kv_heads: int = 0
    norm: str = "layernorm"  # layernorm (the paper's) | rmsnorm (scaled by the root mean square: no centring, no bias)
    # The feed-forward's nonlinearity: relu (the paper's), gelu (GPT's), or swiglu, swish(x W1) * (x W3)
    # (Shazeer, 2020): a third d_ff-wide matrix, so Llama takes d_ff 2/3 as wide for the same parameters.
    activation: str = "relu"
    # Dropout on the attention weights (tensor2tensor's "attention dropout"; not in the paper, whose sec. 5.4
    # names residual and embedding dropout only); None (null): the same as dropout.
    attention_dropout: float | None = None
    # Each head's width D, the paper's d_k = d_v: None (null) is C / H, the paper's; otherwise any width, the
    # heads then concatenated to H * D and projected back to C (Table 3's rows B vary it with H and C fixed).
    d_head: int | None = None

    def __post_init__(self):
        choose(self.positional, "positional", ("sinusoidal", "learned", "rope", "alibi"))
        choose(self.norm, "norm", ("layernorm", "rmsnorm"))
        choose(self.activation, "activation", ("relu", "gelu", "swiglu"))
        for name in ("d_model", "n_heads", "d_ff", "max_len"):
            require(getattr(self, name) > 0, name, "must be > 0")
        require(self.max_len <= MOST_POSITIONS, "max_len", f"{self.max_len} is above {MOST_POSITIONS}: the position "
                "tables and masks are max_len long (a sinusoidal table alone is max_len x d_model numbers)")
        require(self.encoder_layers >= 0, "encoder_layers", "must be >= 0")
        require(self.decoder_layers > 0, "decoder_layers", "must be > 0")
        require(self.d_head is None or self.d_head > 0, "d_head", "must be > 0, or null (d_model / n_heads)")
        require(
            self.d_head or self.d_model % self.n_heads == 0,
            "d_model",
            f"{self.d_model} is not divisible by n_heads {self.n_heads} (or set d_head, each head's width)",
        )
        require(self.n_kv_heads >= 0, "n_kv_heads", "must be >= 0 (0: as many as n_heads)")
        if self.n_kv_heads:
            require(self.n_heads % self.n_kv_heads == 0, "n_kv_heads",
                    f"{self.n_kv_heads} does not divide n_heads {self.n_heads}: each must serve as many query heads")
        require(0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)")
        require(0.0 <= self.activation_dropout < 1.0, "activation_dropout", "must be in [0, 1)")
        require(self.attention_dropout is None or 0.0 <= self.attention_dropout < 1.0, "attention_dropout",
                "must be in [0, 1), or null (the same as dropout)")
        if self.positional == "rope":
            require(self.head_dim % 2 == 0, "positional", f"rope needs an even head width, not {self.head_dim}")
        require(self.rope_base > 1.0, "rope_base",
                f"must be > 1 (each feature pair turning slower), not {self.rope_base}")

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def weights_dropout(self) -> float:
        """The dropout rate on the attention weights."""
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The special tokens' ids, read from the tokenizer (lib.data.tokenizer.special_ids): no module hard-codes them."""
    pad: int
    bos: int
    eos: int
    unk: int


FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch


def largest_alpha(longest: int) -> float:
    """The largest length penalty alpha for which GNMT's ((5 + length) / 6) ** alpha stays within float32 at an
    output of ``longest`` tokens (36.3 at cumsum's max_len 64, 23.5 at multi30k's 256)."""
    return math.log(FLOAT32_MAX) / math.log((5 + longest) / 6)
