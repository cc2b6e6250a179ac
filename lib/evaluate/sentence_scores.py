"""Each output's own score, by which the report picks the worst examples: the one a task names
(``Task.sentence_score``). Only the evaluate stage runs them, so they live here, not in the task's file."""

import sacrebleu


def exact(hypothesis: str, reference: str) -> float:
    """1 when the output is the reference, else 0."""
    return float(hypothesis == reference)


def token_accuracy(hypothesis: str, reference: str) -> float:
    """The share of the reference's positions whose token the output matches."""
    tokens = reference.split()
    return sum(a == b for a, b in zip(hypothesis.split(), tokens)) / len(tokens)


def sentence_bleu(hypothesis: str, reference: str) -> float:
    """Per-sentence BLEU (smoothed), for finding the worst translations."""
    return sacrebleu.sentence_bleu(hypothesis, [reference]).score


SENTENCE_SCORES = {"exact": exact, "token_accuracy": token_accuracy, "sentence_bleu": sentence_bleu}
