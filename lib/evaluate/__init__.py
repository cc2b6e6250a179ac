"""The evaluate stage: greedy and beam search over the test set, scores, samples and scores by length."""
