"""Scores shared by tasks."""

import math


def perplexity(mean_nll: float) -> float:
    """exp of the per-token negative log-likelihood (capped to stay finite)."""
    return math.exp(min(mean_nll, 50.0))


def training_flops(cfg, vocab_size: int, src_lengths: list[int], tgt_lengths: list[int]) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3 x forward, 2 FLOPs a multiply-add).

    cfg: the ModelConfig. Counted on the real (unpadded) lengths, as MFU is:
    per layer the projections (4 C^2 per token for attention, 2 C d_ff for the
    feed-forward) and the attention products (2 C per query-key pair), plus the
    output layer (C V per target token). No source (``src_lengths`` empty):
    the decoder-only LM, whose blocks have no cross attention.
    """
    C, F = cfg.d_model, cfg.d_ff
    macs = 0.0
    for s in src_lengths:
        macs += cfg.encoder_layers * (s * (4 * C * C + 2 * C * F) + 2 * s * s * C)
    cross = bool(src_lengths)
    for i, t in enumerate(tgt_lengths):
        per_layer = t * (4 * C * C + 2 * C * F) + 2 * t * t * C
        if cross:  # queries and output on the target, keys and values on the source
            s = src_lengths[i]
            per_layer += t * 2 * C * C + s * 2 * C * C + 2 * t * s * C
        macs += cfg.decoder_layers * per_layer + t * C * vocab_size
    return 3 * 2 * macs


def speed(tokens: int, flops: float, seconds: float, peak_tflops: float) -> dict:
    """Tokens per second and, given the hardware's peak, model FLOPs utilisation."""
    rates = {"train/tokens_per_s": tokens / seconds}
    if peak_tflops > 0:
        rates["train/mfu"] = flops / seconds / (peak_tflops * 1e12)
    return rates
