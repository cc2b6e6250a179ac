"""torch.compile's settings for training (train.compile): fused element-wise kernels on a GPU."""

import torch
import torch.fx.experimental._config


def compile_model(model: torch.nn.Module, kind: str) -> torch.nn.Module:
    """``torch.compile`` for training; it compiles at the first call.

    A seq2seq's token-budget batches vary in shape, so it is compiled for any shape at once (``dynamic``),
    each size its own symbol: without duck sizing, a first batch with S == T would not fix a graph for S == T
    only. Floats (LayerNorm's eps, the embedding scale) are constants from the start, where a dynamic float
    would restart the trace the first time a kernel needs it fixed.
    """
    if kind == "seq2seq":
        torch.fx.experimental._config.use_duck_shape = False  # the switch the recompile log names
        torch._dynamo.config.specialize_float = True  # the restart's log names LayerNorm's eps
    return torch.compile(model, dynamic=kind == "seq2seq")
