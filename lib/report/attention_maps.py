"""Attention maps straight from the model's forward, and the tokens that label them: what the report, the
attention view and a trained model's user read (no plotting, so no matplotlib)."""

import torch

from transformer.masks import padding_mask, target_mask


def visible(token: str) -> str:
    """A label that shows whitespace tokens."""
    return {" ": "␣", "\n": "⏎", "\t": "⇥"}.get(token, token)


@torch.no_grad()
def attention_maps(model, batch, ids) -> tuple[dict[str, list[torch.Tensor]], torch.Tensor]:
    """Teacher-forced attention of a batch, per layer: encoder self (B, H, S, S),
    decoder self (B, H, T, T) and cross (B, H, T, S), straight from the forward;
    and the token the model finds likeliest at each decoder position (B, T)."""
    src_mask = padding_mask(batch.src, ids.pad)
    memory, encoder = model.encode(batch.src, src_mask, need_weights=True)
    hidden, decoder = model.decode(batch.tgt_in, memory, target_mask(batch.tgt_in, ids.pad), src_mask,
                                   need_weights=True)
    maps = {
        "encoder self-attention": encoder,
        "decoder self-attention": [self_w for self_w, _ in decoder],
        "cross-attention": [cross for _, cross in decoder],
    }
    return maps, model.generator(hidden).argmax(dim=-1)


def token_strings(tokenizer, ids: torch.Tensor) -> list[str]:
    return [tokenizer.id_to_token(t) for t in ids.tolist()]
