"""A model in the pipeline: built for a task on its device, checkpointed and loaded, its losses and greedy
translations over many sentences (what training and every later stage share)."""
