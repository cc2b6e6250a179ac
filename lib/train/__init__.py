"""The train stage: the seq2seq and LM loops, run bookkeeping (checkpoints, curves, the run's identity)."""
