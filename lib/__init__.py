"""A hand-written Transformer (Vaswani et al., 2017) and the pipeline around it."""
