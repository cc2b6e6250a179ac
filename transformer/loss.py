"""Label smoothing (sec. 5.4): cross-entropy against a target distribution that keeps 1 - e on the gold token
and spreads e over the rest of the vocabulary, in plain autograd.

Dims: N target positions (batch and time flattened), V vocabulary.
"""

import math

import torch
import torch.nn.functional as F


def smoothed_targets(target: torch.Tensor, vocab_size: int, pad_id: int, smoothing: float,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The smoothed target distribution (N, V) for gold ids (...).

    The gold token gets 1 - smoothing, the pad token 0, and every other token
    smoothing / (V - 2). Pad targets get an all-zero row: they add no loss.
    """
    target = target.reshape(-1, 1)  # (N, 1)
    dist = torch.full((len(target), vocab_size), smoothing / (vocab_size - 2), dtype=dtype,
                      device=target.device)
    dist.scatter_(1, target, 1.0 - smoothing)
    dist[:, pad_id] = 0.0
    dist[target[:, 0] == pad_id] = 0.0
    return dist  # (N, V)


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, pad_id: int,
                       smoothing: float) -> tuple[torch.Tensor, int]:
    """-sum_v q_v log softmax(logits)_v against ``smoothed_targets`` q, summed over the non-pad targets.

    logits (..., V), target (...). Returns (summed loss, number of non-pad targets);
    with smoothing 0 it is plain cross-entropy.
    """
    V = logits.size(-1)
    log_probs = F.log_softmax(logits.reshape(-1, V).to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    q = smoothed_targets(target, V, pad_id, smoothing, log_probs.dtype)  # (N, V)
    return -(q * log_probs).sum(), int((target != pad_id).sum())


def smoothed_loss_floor(vocab_size: int, smoothing: float) -> float:
    """The least label-smoothed loss a model can reach: the entropy of ``smoothed_targets``, reached when
    it predicts exactly that distribution. A training loss levels off above it; plain cross-entropy
    (the validation loss) can approach 0."""
    if smoothing == 0:
        return 0.0
    return -(1 - smoothing) * math.log(1 - smoothing) - smoothing * math.log(smoothing / (vocab_size - 2))
