"""Dropout with one random byte per element (Srivastava et al., 2014; FlashAttention draws its masks the same way).

``nn.Dropout`` draws one random float per element; on a CPU that sampling is a
large share of a small Transformer's step. Here one 64-bit random integer gives
the masks of eight elements: a byte is kept when it is at least
``round(p * 256)``, so the drop rate is p rounded to a multiple of 1/256, and
kept values are scaled by 1 / (1 - that rate), keeping the expectation exact.
On a GPU and under torch.compile, torch's own fused dropout is used, with p itself.
"""

import torch
import torch.nn.functional as F
from torch import nn

from transformer.fast.eager import eager_on_cpu


class ByteDropout(nn.Dropout):
    """``nn.Dropout`` with the byte masks above on a CPU; it holds nothing more, so it can stand in for one."""

    @property
    def threshold(self) -> int:
        return round(self.p * 256)  # bytes below it are dropped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.threshold == 0:
            return x
        if not eager_on_cpu(x):
            return F.dropout(x, self.p, training=True)
        n, scale = x.numel(), 256 / (256 - self.threshold) if self.threshold < 256 else 0.0
        # The full 64-bit range is the generator's fast path: one draw fills 8 bytes.
        words = torch.empty((n + 7) // 8, dtype=torch.int64, device=x.device).random_(-(2**63), None)
        byte = words.view(torch.uint8)[:n].view(x.shape)  # each byte uniform on 0..255
        # byte - (threshold - 1) clamped to [0, 1] is 1 where kept, 0 where dropped: cheaper than a comparison.
        keep = byte.to(x.dtype).sub_(self.threshold - 1).clamp_(0, 1).mul_(scale)
        return x * keep

    def extra_repr(self) -> str:
        return f"p={self.p}, effective p on a CPU={self.threshold / 256:.4f}"
