"""A trained model as a folder the `transformers` library loads with its auto classes, the same weights:

    python -m lib.use.export --task multi30k --format transformers    # -> exports/multi30k-transformers

A translation model becomes a MarianMT model (Post-LN, sinusoidal positions, scaled embeddings), an LM a GPT-2
model (Pre-LN with a final LayerNorm). Up to float rounding they compute what ours computes:

- Marian lays its sinusoids out as all the sines, then all the cosines, where sec. 3.5 interleaves them. So
  every vector of the residual stream is permuted to that layout (``halves``): embeddings, every matrix that
  reads or writes the stream, every LayerNorm. A norm's mean and variance do not depend on the order.
- Our fused q/k/v become three projections; our output layer's bias is Marian's ``final_logits_bias``.
- GPT-2 adds its position table to unscaled token vectors: its ``wte`` is our embedding times sqrt(C), its
  ``wpe`` our sinusoidal (or learned) table, and its ``lm_head`` (untied) our output layer. GPT-2 has biases
  everywhere; where ours have none (``model.bias: false``) its are zero.

What an architecture cannot express is refused, naming the param, as the CTranslate2 export does.
"""

import json
from pathlib import Path

import torch

from lib.core.files import atomic_dir
from lib.data.tokenizer import BOS, EOS, PAD, UNK, special_ids
from lib.evaluate.options import GENERATION_FILE
from lib.model import checkpoint
from lib.use.paper_block import beyond_the_paper

# What save_pretrained writes for the model and the tokenizer, and the card: a folder holding anything else
# is refused, not replaced
WRITES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja", "README.md")


def unsupported(family, cfg, joint_vocab: bool) -> list[str]:
    """What of the model its `transformers` architecture (``family.transformers``: Marian for seq2seq, GPT-2 for
    the LM) cannot compute as ours does, each naming its param: what neither has, then the family's own."""
    return beyond_the_paper(cfg, family.transformers) + family.transformers_refusals(cfg, joint_vocab)


def halves(d_model: int) -> torch.Tensor:
    """The permutation from sec. 3.5's interleaved sin/cos layout to Marian's: even features, then odd ones."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _bias(linear) -> torch.Tensor:
    return linear.bias if linear.bias is not None else torch.zeros(linear.weight.size(0))


def _norm_bias(norm) -> torch.Tensor:
    return norm.bias if norm.bias is not None else torch.zeros_like(norm.weight)


def _set(target: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor | None = None):
    target.weight.copy_(weight)
    if bias is not None:
        target.bias.copy_(bias)


def marian(model, ids):
    """Our encoder-decoder as a ``MarianMTModel`` with the same outputs."""
    from transformers import MarianConfig, MarianMTModel

    cfg, p = model.cfg, halves(model.cfg.d_model)
    vocab = model.generator.weight.size(0)
    config = MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, max_position_embeddings=cfg.max_len, d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation, dropout=cfg.dropout, attention_dropout=cfg.weights_dropout,
        activation_dropout=cfg.activation_dropout, scale_embedding=True,
        share_encoder_decoder_embeddings=cfg.tie_embeddings, tie_word_embeddings=cfg.tie_embeddings,
        pad_token_id=ids.pad, bos_token_id=ids.bos, eos_token_id=ids.eos, decoder_start_token_id=ids.bos,
        forced_eos_token_id=None, architectures=["MarianMTModel"])
    hf = MarianMTModel(config).eval()

    def attention(theirs, ours):
        for name, (w, b) in zip(("q_proj", "k_proj", "v_proj"), ours.projections()):
            _set(getattr(theirs, name), w[:, p], b if b is not None else torch.zeros(w.size(0)))
        _set(theirs.out_proj, ours.out_proj.weight[p], _bias(ours.out_proj)[p])

    def norm(theirs, ours):
        _set(theirs, ours.weight[p], _norm_bias(ours)[p])

    def feed_forward(theirs, ours):
        _set(theirs.fc1, ours.linear1.weight[:, p], _bias(ours.linear1))
        _set(theirs.fc2, ours.linear2.weight[p], _bias(ours.linear2)[p])

    with torch.no_grad():
        hf.model.encoder.embed_tokens.weight.copy_(model.src_embed.tokens.weight[:, p])
        hf.model.decoder.embed_tokens.weight.copy_(model.tgt_embed.tokens.weight[:, p])
        for theirs, ours in zip(hf.model.encoder.layers, model.encoder_layers):
            attention(theirs.self_attn, ours.self_attn)
            norm(theirs.self_attn_layer_norm, ours.norm1)
            feed_forward(theirs, ours.feed_forward)
            norm(theirs.final_layer_norm, ours.norm2)
        for theirs, ours in zip(hf.model.decoder.layers, model.decoder_layers):
            attention(theirs.self_attn, ours.self_attn)
            norm(theirs.self_attn_layer_norm, ours.norm1)
            attention(theirs.encoder_attn, ours.cross_attn)
            norm(theirs.encoder_attn_layer_norm, ours.norm2)
            feed_forward(theirs, ours.feed_forward)
            norm(theirs.final_layer_norm, ours.norm3)
        hf.lm_head.weight.copy_(model.generator.weight[:, p])
        hf.final_logits_bias.copy_(_bias(model.generator)[None])
    hf.generation_config = greedy_generation(ids, cfg.max_len)
    return hf


def gpt2(model, ids, generation: dict):
    """Our decoder-only LM as a ``GPT2LMHeadModel`` with the same outputs."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.cfg
    config = GPT2Config(
        vocab_size=model.generator.weight.size(0), n_positions=cfg.max_len, n_embd=cfg.d_model,
        n_layer=cfg.decoder_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff, activation_function=cfg.activation,
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.weights_dropout,
        layer_norm_epsilon=model.norm.eps, tie_word_embeddings=False, bos_token_id=ids.bos, eos_token_id=ids.eos,
        pad_token_id=ids.pad, architectures=["GPT2LMHeadModel"])
    hf = GPT2LMHeadModel(config).eval()
    table = model.embed.positions.table
    with torch.no_grad():
        hf.transformer.wte.weight.copy_(model.embed.tokens.weight * model.embed.scale)
        hf.transformer.wpe.weight.copy_(table.weight if hasattr(table, "weight") else table)
        for theirs, ours in zip(hf.transformer.h, model.layers):
            (wq, bq), (wk, bk), (wv, bv) = ours.self_attn.projections()
            weight = torch.cat([wq, wk, wv])  # GPT-2's Conv1D holds a matrix transposed: (in, out)
            _set(theirs.attn.c_attn, weight.T, torch.zeros(weight.size(0)) if bq is None else torch.cat([bq, bk, bv]))
            _set(theirs.attn.c_proj, ours.self_attn.out_proj.weight.T, _bias(ours.self_attn.out_proj))
            _set(theirs.ln_1, ours.norm1.weight, _norm_bias(ours.norm1))
            _set(theirs.mlp.c_fc, ours.feed_forward.linear1.weight.T, _bias(ours.feed_forward.linear1))
            _set(theirs.mlp.c_proj, ours.feed_forward.linear2.weight.T, _bias(ours.feed_forward.linear2))
            _set(theirs.ln_2, ours.norm2.weight, _norm_bias(ours.norm2))
        _set(hf.transformer.ln_f, model.norm.weight, _norm_bias(model.norm))
        hf.lm_head.weight.copy_(model.generator.weight)
    hf.generation_config = sampling_generation(ids, generation)
    return hf


def greedy_generation(ids, max_len: int):
    """``generate``'s defaults as the evaluate stage's greedy search: start at <bos>, never produce <pad> or
    <bos>, stop at <eos>, at most max_len - 1 tokens."""
    from transformers import GenerationConfig

    return GenerationConfig(decoder_start_token_id=ids.bos, bos_token_id=ids.bos, eos_token_id=ids.eos,
                            pad_token_id=ids.pad, suppress_tokens=[ids.pad, ids.bos], do_sample=False, num_beams=1,
                            max_length=max_len)


def sampling_generation(ids, generation: dict):
    """``generate``'s defaults as the LM's evaluate stage samples: its temperature, top-k, top-p and length."""
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=ids.bos, eos_token_id=ids.eos, pad_token_id=ids.pad, do_sample=True,
                            temperature=generation.get("temperature", 1.0), top_k=generation.get("top_k", 0),
                            top_p=generation.get("top_p", 1.0), max_new_tokens=generation.get("max_new_tokens", 100))


def fast_tokenizer(tokenizer, max_len: int):
    """Our tokenizer (its pre-tokenizer, model, post-processor and decoder: the source side's <eos> comes along)
    as a ``PreTrainedTokenizerFast`` that leaves the decoded text's spaces as they are."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, clean_up_tokenization_spaces=False, model_max_length=max_len)


def export(task: str, models: Path, out: Path, card, families: dict):
    """``models`` (model.pt, tokenizer/, generation.json) as the `transformers` folder ``out``, whole or not at
    all, with the model card ``card(model, state)``; a ValueError naming each param the architecture cannot
    express. ``families``: lib.use.families.USES, whose objects say which architecture and build it."""
    model, tokenizers, state = checkpoint.load_directory(models, task=task)
    family = families[state["kind"]]
    reasons = unsupported(family, model.cfg, tokenizers.joint)
    if reasons:
        raise ValueError(f"{models}: {family.transformers} cannot compute this model as ours does: "
                         + "; ".join(reasons))
    generation_path = models / GENERATION_FILE
    generation = json.loads(generation_path.read_text()) if generation_path.is_file() else {}
    hf = family.to_transformers(model, special_ids(tokenizers), generation)
    with atomic_dir(out, WRITES, "the transformers export") as folder:
        hf.save_pretrained(folder)
        fast_tokenizer(tokenizers.target, model.cfg.max_len).save_pretrained(folder)
        settings = json.loads((folder / "tokenizer_config.json").read_text())  # transformers 5 names its backend
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"  # the class both 4 and 5 load tokenizer.json with
        (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
        (folder / "README.md").write_text(card(model, state))

