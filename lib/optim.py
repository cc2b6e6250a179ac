"""Learning-rate schedules (Noam, sec. 5.3; cosine), label smoothing (sec. 5.4), AdamW groups.

Dims: N target positions (batch and time flattened), V vocabulary.
"""

import math

import torch
import torch.nn.functional as F


def noam_lr(step: int, d_model: int, warmup: int, factor: float) -> float:
    """lr = factor * C^-0.5 * min(step^-0.5, step * warmup^-1.5), steps counted from 1.

    Rises linearly for ``warmup`` steps, peaks at step ``warmup``, then decays
    as 1/sqrt(step).
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def smoothed_targets(target: torch.Tensor, vocab_size: int, pad_id: int, smoothing: float) -> torch.Tensor:
    """The smoothed target distribution (N, V) for gold ids (N,).

    The gold token gets 1 - smoothing, the pad token 0, and every other token
    smoothing / (V - 2). Pad targets get an all-zero row: they add no loss.
    """
    dist = torch.full((target.numel(), vocab_size), smoothing / (vocab_size - 2))
    dist = dist.to(target.device)
    dist.scatter_(1, target.reshape(-1, 1), 1.0 - smoothing)
    dist[:, pad_id] = 0.0
    dist[target.reshape(-1) == pad_id] = 0.0
    return dist  # (N, V)


class _LabelSmoothedNLL(torch.autograd.Function):
    """Summed smoothed cross-entropy with a closed-form backward.

    The gradient of -sum_v q_v log softmax(z)_v with respect to the logits z
    is softmax(z) - q. Writing it directly saves autograd's zero-filled
    (N, V) buffers for ``gather`` and ``sum``: on a CPU the loss of a
    d_model-256 model over an 8k vocabulary then costs half as much.
    """

    @staticmethod
    def forward(ctx, logits, target, pad_id: int, smoothing: float):
        V = logits.size(-1)
        logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # (N, V)
        real = target != pad_id  # (N,)
        gold = logp.gather(1, target[:, None]).squeeze(1)  # (N,)
        loss = -(1.0 - smoothing) * gold
        if smoothing > 0:
            rest = logp.sum(dim=1) - gold - logp[:, pad_id]
            loss = loss - smoothing / (V - 2) * rest
        ctx.save_for_backward(logp, target, real)
        ctx.pad_id, ctx.smoothing, ctx.dtype = pad_id, smoothing, logits.dtype
        return (loss * real).sum()

    @staticmethod
    def backward(ctx, grad_out):
        logp, target, real = ctx.saved_tensors
        V, smoothing = logp.size(-1), ctx.smoothing
        other = smoothing / (V - 2)
        grad = logp.exp()  # softmax
        grad.sub_(other)
        grad[:, ctx.pad_id] += other  # q_pad = 0
        grad.scatter_add_(1, target[:, None], grad.new_full((len(target), 1), other - (1.0 - smoothing)))
        grad.mul_((real * grad_out)[:, None])  # pad targets add nothing
        return grad.to(ctx.dtype), None, None, None


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float
) -> tuple[torch.Tensor, int]:
    """Cross-entropy against ``smoothed_targets``, summed over non-pad targets.

    logits (..., V), target (...). Returns (summed loss, number of non-pad
    targets). Computed without materialising the (N, V) distribution:
    -sum_v q_v log p_v = -(1-e) log p_gold - e/(V-2) (sum_v log p_v - log p_gold - log p_pad).
    With smoothing 0 it is plain cross-entropy.
    """
    V = logits.size(-1)
    target = target.reshape(-1)  # (N,)
    loss = _LabelSmoothedNLL.apply(logits.reshape(-1, V), target, pad_id, smoothing)
    return loss, int((target != pad_id).sum())


def cosine_lr(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr`` at ``total``."""
    if step < warmup:
        return lr * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def weight_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: decay the weight matrices of linear layers only.

    Biases, LayerNorm gains and embeddings (and the generator when it is tied
    to an embedding) are not decayed.
    """
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay = [p for p in model.parameters() if id(p) in linear_weights and id(p) not in embeddings]
    keep = [p for p in model.parameters() if id(p) not in {id(q) for q in decay}]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
