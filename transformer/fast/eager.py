"""Whether the CPU-only shortcuts of the fast modules apply to a tensor."""

import torch


def eager_on_cpu(x: torch.Tensor) -> bool:
    """True on a CPU outside torch.compile: on a GPU torch's own forms are cheaper, and under torch.compile
    they are the ones it can trace."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()
