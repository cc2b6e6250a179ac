"""What a library's own Transformer, built as the paper's block, cannot compute of ours: the CTranslate2 and
`transformers` exports refuse these, each naming its param."""


def beyond_the_paper(cfg, target: str) -> list[str]:
    """The params of ``cfg`` (a ModelConfig) outside the paper's block, which ``target`` (the library's
    Transformer, named in each reason) is: positions added to the embeddings, every head a key/value head
    d_model / n_heads wide, LayerNorm, a feed-forward with no gate."""
    reasons = []
    if cfg.positional in ("rope", "alibi"):
        reasons.append(f"model.positional {cfg.positional}: {target} adds its positions to the embeddings")
    if cfg.n_kv_heads and cfg.n_kv_heads != cfg.n_heads:
        reasons.append(f"model.n_kv_heads {cfg.n_kv_heads}: {target} has no grouped-query attention")
    if cfg.d_head and cfg.d_head * cfg.n_heads != cfg.d_model:
        reasons.append(f"model.d_head {cfg.d_head}: {target}'s heads are d_model / n_heads wide "
                       f"({cfg.d_model} / {cfg.n_heads})")
    if cfg.norm != "layernorm":
        reasons.append(f"model.norm {cfg.norm}: {target} normalises with LayerNorm")
    if cfg.activation == "swiglu":
        reasons.append(f"model.activation swiglu: {target}'s feed-forward has no gated unit")
    return reasons
