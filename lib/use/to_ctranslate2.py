"""A trained seq2seq model as a CTranslate2 model directory: the same weights, run by CTranslate2's engine.

    python -m lib.use.export --task cumsum --format ctranslate2     # models/cumsum -> exports/cumsum-ctranslate2

It writes what ``ctranslate2.Translator(directory)`` loads (``model.bin``, ``config.json``, the vocabularies)
and ``translate_options.json``, the keyword arguments of ``translate_batch`` that decode as the evaluate stage
does. What CTranslate2 cannot express is refused, naming the param: RoPE and ALiBi (its Transformer has neither
in cross attention), grouped-query attention, RMSNorm and SwiGLU (its converter's seq2seq Transformer takes
none of them), a decoder-only LM, and GNMT's length penalty (CTranslate2's divides by |Y| ** a instead).
"""

import json
from pathlib import Path

import numpy as np
import torch
from ctranslate2.specs import common_spec, transformer_spec

from lib.core.files import atomic_dir
from lib.use.families import USES
from lib.use.paper_block import beyond_the_paper
from lib.data.tokenizer import BOS, EOS, PAD, UNK, special_ids
from lib.evaluate.options import GENERATION_FILE
from lib.model import checkpoint

OPTIONS_FILE = "translate_options.json"
# What CTranslate2's spec.save writes, and the options: a folder holding anything else is refused, not replaced
WRITES = ("model.bin", "config.json", "*vocabulary.json", "*vocabulary.txt", OPTIONS_FILE)


def unsupported(family: str, cfg, alpha: float) -> list[str]:
    """What of the model and its decoding CTranslate2 cannot run as we do, each naming its param."""
    reasons = [refused] if (refused := USES[family].ctranslate2) else []
    reasons += beyond_the_paper(cfg, "CTranslate2's seq2seq Transformer")
    if alpha:
        reasons.append(f"evaluate.alpha {alpha}: CTranslate2 has no GNMT length penalty ((5 + |Y|) / 6) ** alpha "
                       "(its length_penalty divides by |Y| ** a); export with --alpha 0 to decode without one")
    return reasons


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _linear(spec, weight: torch.Tensor, bias: torch.Tensor | None):
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _norm(spec, norm):
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias) if norm.bias is not None else np.zeros(norm.weight.shape, dtype=np.float32)


def _joined(*biases: torch.Tensor | None) -> torch.Tensor | None:
    """Projections' biases as one fused layer's: all there (model.bias) or none."""
    return None if biases[0] is None else torch.cat(biases)


def _attention(spec, attn, cross: bool):
    """CTranslate2 fuses q, k and v in self attention (linear 0), k and v in cross attention (linear 1)."""
    (wq, bq), (wk, bk), (wv, bv) = attn.projections()
    if cross:
        _linear(spec.linear[0], wq, bq)
        _linear(spec.linear[1], torch.cat([wk, wv]), _joined(bk, bv))
    else:
        _linear(spec.linear[0], torch.cat([wq, wk, wv]), _joined(bq, bk, bv))
    _linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)


def _feed_forward(spec, ff, norm):
    _linear(spec.linear_0, ff.linear1.weight, ff.linear1.bias)
    _linear(spec.linear_1, ff.linear2.weight, ff.linear2.bias)
    _norm(spec.layer_norm, norm)


def _embedding(stack_spec, embedding, embeddings_spec):
    """Token vectors (CTranslate2 scales them by sqrt(C) as sec. 3.4 does) and our positions' own table."""
    embeddings_spec.weight = _array(embedding.tokens.weight)
    table = embedding.positions.table
    stack_spec.position_encodings.encodings = _array(table.weight if hasattr(table, "weight") else table)


def model_spec(model, tokenizers):
    """The CTranslate2 specification of ``model`` (a Transformer), its vocabularies and special tokens."""
    cfg = model.cfg
    activation = common_spec.Activation.GELU if cfg.activation == "gelu" else common_spec.Activation.RELU
    spec = transformer_spec.TransformerSpec.from_config((cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads,
                                                        pre_norm=cfg.norm_first, activation=activation)
    spec.config.layer_norm_epsilon = model.decoder_layers[0].norm1.eps
    spec.config.bos_token, spec.config.eos_token, spec.config.unk_token = BOS, EOS, UNK
    spec.config.decoder_start_token = BOS
    _embedding(spec.encoder, model.src_embed, spec.encoder.embeddings[0])
    _embedding(spec.decoder, model.tgt_embed, spec.decoder.embeddings)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers):
        _attention(layer_spec.self_attention, layer.self_attn, cross=False)
        _norm(layer_spec.self_attention.layer_norm, layer.norm1)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.norm2)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers):
        _attention(layer_spec.self_attention, layer.self_attn, cross=False)
        _norm(layer_spec.self_attention.layer_norm, layer.norm1)
        _attention(layer_spec.attention, layer.cross_attn, cross=True)
        _norm(layer_spec.attention.layer_norm, layer.norm2)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.norm3)
    if cfg.norm_first:  # Pre-LN's final norm of each stack
        _norm(spec.encoder.layer_norm, model.encoder_norm)
        _norm(spec.decoder.layer_norm, model.decoder_norm)
    _linear(spec.decoder.projection, model.generator.weight, model.generator.bias)
    for register, tokenizer in ((spec.register_source_vocabulary, tokenizers.source),
                                (spec.register_target_vocabulary, tokenizers.target)):
        register([tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())])
    return spec


def translate_options(generation: dict, max_len: int) -> dict:
    """``translate_batch``'s arguments for the evaluate stage's search (beam width, no length penalty, neither
    pad nor bos ever produced, inputs of at most max_len tokens), and ``max_extra_tokens``: its
    ``max_decoding_length`` is one a batch, which a caller sets to the batch's longest source plus that."""
    return {"translate_batch": {"beam_size": max(1, generation.get("beam_size", 1)), "length_penalty": 0.0,
                                "suppress_sequences": [[PAD], [BOS]], "max_input_length": max_len,
                                "max_decoding_length": max_len - 1},
            "max_extra_tokens": generation.get("max_extra_tokens", 0)}


def export(task: str, models: Path, out: Path, alpha: float | None = None):
    """``models`` (model.pt, tokenizer/, generation.json) as the CTranslate2 directory ``out``, whole or not at
    all; a ValueError naming each option CTranslate2 cannot express."""
    model, tokenizers, state = checkpoint.load_directory(models, task=task)
    generation_path = models / GENERATION_FILE
    generation = json.loads(generation_path.read_text()) if generation_path.is_file() else {}
    alpha = generation.get("alpha", 0.0) if alpha is None else alpha
    decoding_alpha = alpha if generation.get("beam_size", 1) > 1 else 0.0  # greedy search has no penalty
    reasons = unsupported(state["kind"], model.cfg, decoding_alpha)
    if reasons:
        raise ValueError(f"{models}: CTranslate2 cannot run this model as ours runs: " + "; ".join(reasons))
    special_ids(tokenizers)  # every special token there, or a ValueError naming the missing one
    spec = model_spec(model, tokenizers)
    spec.validate()  # as CTranslate2's own converters do: every weight set, of the shape its layer takes
    spec.optimize()  # the weights as it stores them (float32: int8 is CTranslate2's choice when loading)
    with atomic_dir(out, WRITES, "the CTranslate2 export") as folder:
        spec.save(str(folder))
        (folder / OPTIONS_FILE).write_text(json.dumps(translate_options(generation, model.cfg.max_len), indent=1)
                                           + "\n")


def translate(translator, sources: list[list[str]], options: dict, max_batch_tokens: int = 8192,
              exact_limits: bool = True) -> list[list[str]]:
    """The best output tokens of each source by ``translator`` (a ``ctranslate2.Translator``) under
    ``options`` (translate_options.json's). ``exact_limits``: sources of one length are translated together,
    so that each may produce its length + max_extra_tokens tokens as ours may; else one call, the limit
    the longest source's (as a user would call it, and the faster)."""
    kwargs = dict(options["translate_batch"], max_batch_size=max_batch_tokens, batch_type="tokens")
    extra, cap = options["max_extra_tokens"], kwargs.pop("max_decoding_length")
    groups = {}
    for i, source in enumerate(sources):
        groups.setdefault(len(source) if exact_limits else 0, []).append(i)
    outputs: list[list[str]] = [[] for _ in sources]
    for indices in groups.values():
        longest = max(len(sources[i]) for i in indices)
        results = translator.translate_batch([sources[i] for i in indices], **kwargs,
                                             max_decoding_length=min(cap, longest + extra))
        for i, result in zip(indices, results):
            outputs[i] = result.hypotheses[0]
    return outputs
