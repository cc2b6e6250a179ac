"""The output layer and the label-smoothed loss fused, a block of rows at a time (the fused linear
cross-entropy of Liger Kernel and Cut Cross-Entropy): the (N, V) logits never exist whole, and each block's
gradient is made in closed form, softmax(z) - q, while it is still in the cache. Held equal to
``transformer.loss.label_smoothed_nll`` of the generator's logits by tests/test_fast.py.

Dims: N target positions (batch and time flattened), n a block's rows, C model width, V vocabulary.
"""

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from transformer.fast.eager import eager_on_cpu

CPU_ROWS, GPU_ROWS = 256, 8192  # a block's rows: a CPU's cache; a GPU pays a dozen launches a block


def _row_terms(z: torch.Tensor, target: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, ...]:
    """What the smoothed loss needs of logits z (N, V): the gold logit, the row sum, the pad logit (N,) each."""
    return z.gather(1, target[:, None]).squeeze(1), z.sum(dim=1), z[:, pad_id].clone()


def _smoothed_nll(gold, total, pad, lse, target: torch.Tensor, pad_id: int, smoothing: float, V: int):
    """Per-row smoothed cross-entropy from ``_row_terms`` and the rows' logsumexp lse (N,).

    With log p_v = z_v - lse: -sum_v q_v log p_v
    = -(1-e) log p_gold - e/(V-2) (sum_v log p_v - log p_gold - log p_pad). Pad targets give 0.
    """
    log_gold = gold - lse
    loss = -(1.0 - smoothing) * log_gold
    if smoothing > 0:
        loss = loss - smoothing / (V - 2) * (total - V * lse - log_gold - (pad - lse))
    return loss * (target != pad_id)


def _q_other(smoothing: float, V: int) -> float:
    """The smoothed target's mass on each token that is neither the gold one nor pad."""
    return smoothing / (V - 2)


def _softmax_minus_target_(e: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float,
                           row_scale: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
    """Turn e = exp(z - c) (N, V), for any per-row c, in place into (softmax - q) * row_scale: the loss's
    gradient. The softmax is e / row_sum (N,)."""
    other = _q_other(smoothing, e.size(-1))
    p_scale = row_scale / row_sum
    e.mul_(p_scale[:, None]).sub_((other * row_scale)[:, None])  # (p - other) * row_scale
    e[:, pad_id] += other * row_scale  # q_pad = 0
    return e.scatter_add_(1, target[:, None], ((other - (1.0 - smoothing)) * row_scale)[:, None])


def _softmax_minus_target_in(low: torch.dtype, e: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float,
                             row_scale: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
    """``_softmax_minus_target_`` written straight into dtype ``low`` (autocast's bf16): one pass over e, each
    entry rounded once from float32; each row's pad and gold entries are made apart and written over the bulk's.
    """
    other = _q_other(smoothing, e.size(-1))
    p_scale = row_scale / row_sum  # (N,): softmax = e * p_scale / row_scale
    grad = torch.empty(e.shape, dtype=low, device=e.device)
    torch.addcmul((-other * row_scale)[:, None], e, p_scale[:, None], out=grad)  # (p - other) * row_scale
    grad[:, pad_id] = (e[:, pad_id] * p_scale).to(low)  # q_pad = 0
    gold = e.gather(1, target[:, None]).squeeze(1) * p_scale - (1.0 - smoothing) * row_scale  # q_gold = 1 - smoothing
    # Indexed, not scattered: a CPU's bf16 scatter_ would widen the whole of grad to float32 and back.
    grad[torch.arange(grad.size(0), device=grad.device), target] = gold.to(low)
    return grad


def _back_through_generator(p: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias, acc: torch.dtype):
    """The gradients for h (n, C), weight (V, C) and bias (V,) (or None) from the logits' gradient p (n, V)."""
    return p @ weight, p.t() @ h, None if bias is None else p.sum(dim=0, dtype=acc)


def _block(h, t, weight, bias, pad_id: int, smoothing: float, low: torch.dtype | None, with_grad: bool):
    """One block of ``_generator_nll``: rows h (n, C) and their targets t (n,), none of them pad. Returns its
    summed loss and, ``with_grad``, its gradients for h, weight and bias (or None)."""
    acc = torch.promote_types(weight.dtype, torch.float32)
    z = F.linear(h, weight, bias)  # (n, V); under autocast the product is bf16
    # Shift each row by its max (exact in bf16 too), widening a bf16 product on the way: on a CPU a cast
    # then a subtraction in place is the cheaper; on a GPU the subtraction alone.
    shift = z.amax(dim=1, keepdim=True).to(acc)
    z = z.to(acc).sub_(shift) if eager_on_cpu(z) or z.dtype == acc else torch.sub(z, shift)
    terms = _row_terms(z, t, pad_id)
    row_sum = z.exp_().sum(dim=1)  # z is now exp(z - max) (n, V)
    loss = _smoothed_nll(*terms, row_sum.log(), t, pad_id, smoothing, z.size(-1)).sum()
    if not with_grad:
        return loss, None
    # Under autocast the gradient is made in the products' precision at once, not cast at each product.
    scale = torch.ones_like(row_sum)  # every row's gradient whole: none is padding
    p = _softmax_minus_target_(z, t, pad_id, smoothing, scale, row_sum) if low is None else \
        _softmax_minus_target_in(low, z, t, pad_id, smoothing, scale, row_sum)
    return loss, _back_through_generator(p, h, weight, bias, acc)


def _block_to_compile(h, t, weight, bias, pad_id: int, smoothing: float, low: torch.dtype | None, with_grad: bool):
    """``_block`` as plain math, for torch.compile (train.compile) to fuse: q is made by comparing each column
    with the row's target and pad, not scattered, so that inductor fuses the passes over the logits."""
    acc = torch.promote_types(weight.dtype, torch.float32)
    z = F.linear(h, weight, bias).to(acc)  # (n, V)
    V = z.size(-1)
    lse = torch.logsumexp(z, dim=1)  # (n,)
    loss = _smoothed_nll(*_row_terms(z, t, pad_id), lse, t, pad_id, smoothing, V).sum()
    if not with_grad:
        return loss, None
    column, other = torch.arange(V, device=z.device), z.new_tensor(_q_other(smoothing, V))  # (V,); q in z's dtype
    q = torch.where(column == t[:, None], 1.0 - smoothing, torch.where(column == pad_id, 0.0, other))  # (n, V)
    p = ((z - lse[:, None]).exp() - q).to(low or acc)  # (n, V); t holds no pad, as in ``_block``
    return loss, _back_through_generator(p, h, weight, bias, acc)


@functools.cache
def _compiled_block(compile: Callable) -> Callable:
    """``_block_to_compile`` compiled by ``compile`` (torch.compile, or a test's stand-in), made once."""
    return compile(_block_to_compile)


def _generator_nll(hidden, weight, bias, target, pad_id: int, smoothing: float, rows: int, with_grad: bool,
                   compiled: bool = False):
    """The summed loss of ``F.linear(hidden, weight, bias)``, ``rows`` positions at a time; with ``with_grad``
    also the gradients for hidden, weight and bias (or None), else Nones. ``compiled``: each block by
    ``_block_to_compile`` under torch.compile."""
    acc = torch.promote_types(weight.dtype, torch.float32)  # float32, or float64 for a float64 model
    total = torch.zeros((), dtype=acc, device=hidden.device)
    grads = None
    if with_grad:
        grads = (torch.empty(hidden.shape, dtype=acc, device=hidden.device),
                 torch.zeros(weight.shape, dtype=acc, device=weight.device),
                 None if bias is None else torch.zeros(bias.shape, dtype=acc, device=bias.device))
    device = hidden.device.type
    autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)  # none on "meta"
    low = torch.get_autocast_dtype(device) if autocast else None
    block = _compiled_block(torch.compile) if compiled else _block
    for i in range(0, len(hidden), rows):
        loss, block_grads = block(hidden[i:i + rows], target[i:i + rows], weight, bias, pad_id, smoothing, low,
                                  with_grad)
        total += loss
        if with_grad:
            grads[0][i:i + rows] = block_grads[0]
            grads[1].add_(block_grads[1])
            if bias is not None:
                grads[2].add_(block_grads[2])
    return total, grads


class _GeneratorNLL(torch.autograd.Function):
    """``_generator_nll`` with its gradients computed in the forward pass, scaled in the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, pad_id: int, smoothing: float, rows: int, compiled: bool):
        total, grads = _generator_nll(hidden, weight, bias, target, pad_id, smoothing, rows, True, compiled)
        ctx.grads = grads
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        scaled = [None if g is None else (g * grad_out).to(dtype) for g, dtype in zip(ctx.grads, ctx.dtypes)]
        ctx.grads = None
        return *scaled, None, None, None, None, None


def generator_nll(hidden: torch.Tensor, generator: torch.nn.Linear, target: torch.Tensor, pad_id: int,
                  smoothing: float, rows: int | None = None, count: int | None = None,
                  compiled: bool = False) -> tuple[torch.Tensor, int]:
    """``label_smoothed_nll(generator(hidden), ...)`` without the (N, V) logits: (summed loss, non-pad targets).

    hidden (..., C) the decoder's output, target (...). ``rows``: a block's rows (default CPU_ROWS on a CPU,
    GPU_ROWS elsewhere). ``count``: the non-pad targets, where the caller has them on the host; counting them
    here would make the host wait for the device. Only those rows go through the output layer: a padding
    row's loss and gradient are zero. ``compiled``: each block by torch.compile (train.compile), fused.
    """
    if rows is None:
        rows = CPU_ROWS if hidden.device.type == "cpu" else GPU_ROWS
    C = hidden.size(-1)
    hidden, target = hidden.reshape(-1, C), target.reshape(-1)  # (N, C), (N,)
    count = int((target != pad_id).sum()) if count is None else count
    if count < len(target):  # the real rows, in their order; a sort, where nonzero() would make the host wait
        real = torch.argsort(target == pad_id, stable=True)[:count]  # (count,)
        hidden, target = hidden.index_select(0, real), target.index_select(0, real)  # the rest get no gradient
    weight, bias = generator.weight, generator.bias
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias)):
        loss = _GeneratorNLL.apply(hidden, weight, bias, target, pad_id, smoothing, rows, compiled)
    else:
        loss, _ = _generator_nll(hidden, weight, bias, target, pad_id, smoothing, rows, False, compiled)
    return loss, count
