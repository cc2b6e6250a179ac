"""Whether a difference between two runs is real: paired bootstrap resampling over the test examples (Koehn,
2004), computed as sacreBLEU's ``paired_bs`` computes it, so that its BLEU and chrF p-values are sacreBLEU's.

Each run's test set is described by per-example sufficient statistics (BLEU's n-gram counts, an exact match
and a 1, a sentence's negative log-likelihood and its token count). One resample draws the examples with
replacement, the same draw for both runs; a score is computed from the summed statistics. The p-value is the
share of resamples whose centred difference is larger than the observed one; the interval is the 95% range of
the resampled differences (new minus base).
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

SEED = 12345  # sacreBLEU's default (SACREBLEU_SEED)
RESAMPLES = 1000  # sacreBLEU's default for paired_bs


@dataclass(frozen=True)
class Difference:
    base: float
    new: float
    low: float  # the 95% interval of new - base over the resamples
    high: float
    p_value: float

    @property
    def delta(self) -> float:
        return self.new - self.base

    def significant(self, level: float = 0.05) -> bool:
        return self.p_value < level


def paired_bootstrap(base: np.ndarray, new: np.ndarray, score: Callable[[np.ndarray], float],
                     resamples: int = RESAMPLES, seed: int = SEED) -> Difference:
    """``base`` and ``new``: (N, K) sufficient statistics of the same N test examples; ``score``: the score of
    K summed statistics."""
    if base.shape[0] != new.shape[0]:
        raise ValueError(f"the runs scored {base.shape[0]} and {new.shape[0]} test examples: not the same test set")
    base, new = np.asarray(base, dtype="float32"), np.asarray(new, dtype="float32")  # as sacreBLEU holds them
    n = len(base)
    draws = np.random.default_rng(seed).choice(n, size=(resamples, n), replace=True)
    base_scores = np.array([score(stats.sum(0)) for stats in base[draws]])
    new_scores = np.array([score(stats.sum(0)) for stats in new[draws]])
    observed_base, observed_new = score(base.sum(0)), score(new.sum(0))
    spread = np.abs(new_scores - base_scores)
    p_value = (np.sum(spread - spread.mean() > abs(observed_new - observed_base)).item() + 1) / (resamples + 1)
    if observed_new == observed_base:  # sacreBLEU's count says 1 / (resamples + 1) here: no difference is no signal
        p_value = 1.0
    differences = np.sort(new_scores - base_scores)
    cut = resamples // 40  # sacreBLEU's estimate_ci: 1/40 from each end
    return Difference(float(observed_base), float(observed_new), float(differences[cut]), float(differences[-cut - 1]),
                      p_value)


def sacrebleu_statistics(metric, hypotheses: list[str], references: list[str]) -> np.ndarray:
    return np.array(metric._extract_corpus_statistics(hypotheses, [references]), dtype="float32")


def text_metric(metric) -> Callable[[list[str], list[str], list[str]], Difference]:
    """A test of ``metric`` (sacreBLEU's BLEU or chrF) between two runs' outputs of the same references."""
    def test(base: list[str], new: list[str], references: list[str]) -> Difference:
        return paired_bootstrap(sacrebleu_statistics(metric, base, references),
                                sacrebleu_statistics(metric, new, references),
                                lambda summed: metric._compute_score_from_stats(summed).score)
    return test


bleu_test = text_metric(BLEU())
chrf_test = text_metric(CHRF())


def mean_test(base, new) -> Difference:
    """A mean over examples (exact match: 1 or 0 each)."""
    base, new = np.asarray(base, dtype="float32"), np.asarray(new, dtype="float32")
    return paired_bootstrap(np.stack([base, np.ones_like(base)], 1), np.stack([new, np.ones_like(new)], 1),
                            lambda summed: float(summed[0] / summed[1]))


def ratio_test(base_totals, base_counts, new_totals, new_counts) -> Difference:
    """A ratio of sums over examples (a loss: each sentence's negative log-likelihood over its tokens)."""
    return paired_bootstrap(np.stack([base_totals, base_counts], 1), np.stack([new_totals, new_counts], 1),
                            lambda summed: float(summed[0] / summed[1]))
