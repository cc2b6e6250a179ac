"""Dropout with one random byte per element (Srivastava et al., 2014; FlashAttention draws its masks the same way).

``nn.Dropout`` draws one random float per element through a Bernoulli
sampler; on a CPU that sampling costs a quarter of a small Transformer's
training step. Here one 32-bit random integer gives the masks of four
elements: each byte is kept when it is at least ``round(p * 256)``, so the
drop rate is p rounded to a multiple of 1/256 (0.1 -> 26/256 ~ 0.102), and the
kept values are scaled by 1 / (1 - that rate), keeping the expectation exact.
"""

import torch
from torch import nn


class Dropout(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.threshold = round(p * 256)  # bytes below it are dropped
        self.scale = 256 / (256 - self.threshold) if self.threshold < 256 else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.threshold == 0:
            return x
        n = x.numel()
        words = torch.empty((n + 3) // 4, dtype=torch.int32, device=x.device).random_(-(2**31), 2**31)
        keep = words.view(torch.uint8)[:n].view(x.shape) >= self.threshold  # each byte uniform on 0..255
        return x * keep.to(x.dtype).mul_(self.scale)

    def extra_repr(self) -> str:
        return f"p={self.p}, effective p={self.threshold / 256:.4f}"
