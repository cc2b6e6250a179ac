"""Dropout with one random byte per element (Srivastava et al., 2014; FlashAttention draws its masks the same way).

``nn.Dropout`` draws one random float per element through a Bernoulli
sampler; on a CPU that sampling costs a quarter of a small Transformer's
training step. Here one 64-bit random integer gives the masks of eight
elements: each byte is kept when it is at least ``round(p * 256)``, so the
drop rate is p rounded to a multiple of 1/256 (0.1 -> 26/256 ~ 0.102), and the
kept values are scaled by 1 / (1 - that rate), keeping the expectation exact.
On a GPU, PyTorch's own dropout is a single fused kernel, the cheapest there
is, and is used instead (with p itself); so it is under ``torch.compile``
(``train.compile``), which traces torch's dropout into its fused kernels and
cannot trace the in-place draw.
"""

import torch
import torch.nn.functional as F
from torch import nn


def eager_on_cpu(x: torch.Tensor) -> bool:
    """Whether the CPU-only shortcuts (here, attention's skipped pass, the loss's widening of bf16 logits)
    apply to ``x``: on a GPU torch's own forms are cheaper, and under torch.compile they are the ones it
    can trace."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


class Dropout(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.threshold = round(p * 256)  # bytes below it are dropped
        self.scale = 256 / (256 - self.threshold) if self.threshold < 256 else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.threshold == 0:
            return x
        if not eager_on_cpu(x):
            return F.dropout(x, self.p, training=True)
        n = x.numel()
        # The full 64-bit range is the generator's fast path: one draw fills 8 bytes (a 32-bit
        # range also costs a 64-bit draw, for 4 bytes).
        words = torch.empty((n + 7) // 8, dtype=torch.int64, device=x.device).random_(-(2**63), None)
        byte = words.view(torch.uint8)[:n].view(x.shape)  # each byte uniform on 0..255
        # Bytes are whole numbers, so byte - (threshold - 1) clamped to [0, 1] is 1 where the byte
        # is kept and 0 where it is dropped: a cast and three passes in place, a quarter of the
        # time of a comparison and the cast of its bool mask on a CPU.
        keep = byte.to(x.dtype).sub_(self.threshold - 1).clamp_(0, 1).mul_(self.scale)
        return x * keep

    def extra_repr(self) -> str:
        return f"p={self.p}, effective p on a CPU={self.threshold / 256:.4f}"
