"""The losses training and evaluation compute over batches: the seq2seq model's label-smoothed loss of a
teacher-forced batch, and the LM's next-token cross-entropy; each also over a whole split, in eval mode.

Dims: B batch, T length, C model width, V vocabulary.
"""

import math

import torch
import torch.nn.functional as F

from lib.data.pairs import Pairs, SpecialIds, collate, token_budget_batches
from transformer.fast.loss import generator_nll
from transformer.loss import label_smoothed_nll
from transformer.masks import padding_mask, target_mask


def seq2seq_loss(model, batch, ids: SpecialIds, smoothing: float, fast: bool = True,
                 compiled: bool = False) -> tuple[torch.Tensor, int]:
    """Summed label-smoothed loss of a teacher-forced batch, and its target count.

    ``fast``: the output layer fused with the loss (transformer.fast.loss); else the logits, then the
    reference loss. ``model`` may be wrapped in DistributedDataParallel: its forward runs through the
    wrapper, and the fused loss uses the inner model's generator. ``compiled``: the fused loss compiled too.
    """
    src_mask, tgt_mask = padding_mask(batch.src, ids.pad), target_mask(batch.tgt_in, ids.pad)
    if not fast:
        logits = model(batch.src, batch.tgt_in, src_mask, tgt_mask)  # (B, T, V)
        return label_smoothed_nll(logits, batch.tgt_out, ids.pad, smoothing)
    hidden = model(batch.src, batch.tgt_in, src_mask, tgt_mask, project=False)  # (B, T, C)
    generator = getattr(model, "module", model).generator
    return generator_nll(hidden, generator, batch.tgt_out, ids.pad, smoothing, count=batch.n_tokens, compiled=compiled)


@torch.no_grad()
def mean_loss(model, pairs: Pairs, ids: SpecialIds, max_tokens: int, device, fast: bool = True) -> float:
    """Per-token cross-entropy (no smoothing) over a whole split, in eval mode."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for indices in token_budget_batches(pairs, max_tokens):
        loss, n = seq2seq_loss(model, collate(pairs, indices, ids).to(device), ids, 0.0, fast)
        total, count = total + loss.item(), count + n
    model.train(was_training)
    return total / count


def lm_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (no smoothing: it is a likelihood we report)."""
    logits = model(x)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


@torch.no_grad()
def estimate_loss(model, batches: list[tuple[torch.Tensor, torch.Tensor]], device) -> float:
    """``lm_loss`` averaged over fixed batches, in eval mode."""
    was_training = model.training
    model.eval()
    losses = [lm_loss(model, x.to(device), y.to(device)).item() for x, y in batches]
    model.train(was_training)
    return sum(losses) / len(losses)


def perplexity(mean_nll: float) -> float:
    """exp of the per-token negative log-likelihood (capped to stay finite)."""
    return math.exp(min(mean_nll, 50.0))
