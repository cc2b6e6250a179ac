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
    logp = F.log_softmax(logits.float().reshape(-1, V), dim=-1)  # (N, V)
    target = target.reshape(-1)  # (N,)
    real = target != pad_id
    gold = logp.gather(1, target[:, None]).squeeze(1)  # (N,)
    loss = -(1.0 - smoothing) * gold
    if smoothing > 0:
        rest = logp.sum(dim=1) - gold - logp[:, pad_id]
        loss = loss - smoothing / (V - 2) * rest
    return loss[real].sum(), int(real.sum())


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
