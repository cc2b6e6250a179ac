"""Learning-rate schedules, each a pure function of the step: Noam's warmup and decay (sec. 5.3), a linear
warmup followed by cosine decay (as nanoGPT trains its LM), and the cooldown a run that knows its end applies."""

import math


def noam_lr(step: int, d_model: int, warmup: int, factor: float) -> float:
    """lr = factor * C^-0.5 * min(step^-0.5, step * warmup^-1.5), steps counted from 1.

    Rises linearly for ``warmup`` steps, peaks at step ``warmup``, then decays
    as 1/sqrt(step).
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def cosine_lr(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr`` at ``total``."""
    if step < warmup:
        return lr * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def cooldown_factor(done: float, total: float, share: float) -> float:
    """1 until the last ``share`` of a run of ``total`` (steps or seconds), then falling linearly to 0 at
    ``total``: warmup-stable-decay's decay (Hägele et al. 2024). ``done``: how much of the run has passed."""
    if share <= 0:
        return 1.0
    return min(1.0, max(0.0, (total - done) / (share * total)))
