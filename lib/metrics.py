"""Scores shared by tasks."""

import math


def perplexity(mean_nll: float) -> float:
    """exp of the per-token negative log-likelihood (capped to stay finite)."""
    return math.exp(min(mean_nll, 50.0))
