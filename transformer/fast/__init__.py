"""The speed work, beside the reference it is held equal to (tests/test_fast.py): grouped attention and the
fused projections' layout (attention), byte-mask dropout for CPUs (dropout), the output layer fused with the
loss (loss), and torch.compile's settings (compile). ``train.fast`` picks it; the weights are the same either way.
"""

from torch import nn

from transformer.attention import MultiHeadAttention
from transformer.fast.attention import FastMultiHeadAttention
from transformer.fast.dropout import ByteDropout

FAST_MODULES = {MultiHeadAttention: FastMultiHeadAttention, nn.Dropout: ByteDropout}


def speed_up(model: nn.Module) -> nn.Module:
    """``model`` with each reference module run by its fast form, in place. A fast form is a subclass that
    holds nothing more, so parameters, buffers and the state dict stay as they are."""
    for module in model.modules():
        fast = FAST_MODULES.get(type(module))
        if fast is not None:
            module.__class__ = fast
    return model
