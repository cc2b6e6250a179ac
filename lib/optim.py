"""Learning-rate schedules (Noam, sec. 5.3; cosine), label smoothing (sec. 5.4), AdamW groups.

Dims: N target positions (batch and time flattened), V vocabulary.
"""

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lib.dropout import eager_on_cpu


def noam_lr(step: int, d_model: int, warmup: int, factor: float) -> float:
    """lr = factor * C^-0.5 * min(step^-0.5, step * warmup^-1.5), steps counted from 1.

    Rises linearly for ``warmup`` steps, peaks at step ``warmup``, then decays
    as 1/sqrt(step).
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def smoothed_targets(target: torch.Tensor, vocab_size: int, pad_id: int, smoothing: float) -> torch.Tensor:
    """The smoothed target distribution (N, V) for gold ids (N,).

    The gold token gets 1 - smoothing, the pad token 0, and every other token
    smoothing / (V - 2). Pad targets get an all-zero row: they add no loss.
    """
    dist = torch.full((target.numel(), vocab_size), smoothing / (vocab_size - 2))
    dist = dist.to(target.device)
    dist.scatter_(1, target.reshape(-1, 1), 1.0 - smoothing)
    dist[:, pad_id] = 0.0
    dist[target.reshape(-1) == pad_id] = 0.0
    return dist  # (N, V)


def smoothed_loss_floor(vocab_size: int, smoothing: float) -> float:
    """The least label-smoothed loss a model can reach: the entropy of ``smoothed_targets``, reached when
    it predicts exactly that distribution. A training loss levels off above it; plain cross-entropy
    (the validation loss) can approach 0."""
    if smoothing == 0:
        return 0.0
    return -(1 - smoothing) * math.log(1 - smoothing) - smoothing * math.log(smoothing / (vocab_size - 2))


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
                           row_scale: torch.Tensor, row_sum: torch.Tensor | None = None) -> torch.Tensor:
    """Turn rows e (N, V) in place into (softmax - q) * row_scale: the loss's gradient.

    e is the softmax itself, or with ``row_sum`` (N,) exp(z - c) for any per-row c,
    whose softmax is e / row_sum.
    """
    other = _q_other(smoothing, e.size(-1))
    p_scale = row_scale if row_sum is None else row_scale / row_sum
    e.mul_(p_scale[:, None]).sub_((other * row_scale)[:, None])  # (p - other) * row_scale
    e[:, pad_id] += other * row_scale  # q_pad = 0
    return e.scatter_add_(1, target[:, None], ((other - (1.0 - smoothing)) * row_scale)[:, None])


def _softmax_minus_target_in(low: torch.dtype, e: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float,
                             row_scale: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
    """``_softmax_minus_target_`` of e = exp(z - c) (N, V), float32, written straight into dtype ``low`` (the
    products' bf16 under autocast): one pass over e where scaling, shifting and casting make three. Every entry
    is rounded once from float32, as a cast of the float32 gradient rounds it: each row's pad and gold entries,
    whose q is not the others', are made from e apart (two per row) and written over the bulk's.
    """
    other = _q_other(smoothing, e.size(-1))
    p_scale = row_scale / row_sum  # (N,): softmax = e * p_scale / row_scale
    grad = torch.empty(e.shape, dtype=low, device=e.device)
    torch.addcmul((-other * row_scale)[:, None], e, p_scale[:, None], out=grad)  # (p - other) * row_scale
    grad[:, pad_id] = (e[:, pad_id] * p_scale).to(low)  # q_pad = 0
    gold = e.gather(1, target[:, None]).squeeze(1) * p_scale - (1.0 - smoothing) * row_scale  # q_gold = 1 - smoothing
    # Indexed, not scattered: a CPU's bf16 scatter_ widens the whole of grad to float32 and back (0.3 ms of a
    # 256 x 8,000 block, where writing the same 256 entries this way takes 0.005; RESULTS.md, fifty-first session).
    grad[torch.arange(grad.size(0), device=grad.device), target] = gold.to(low)
    return grad


class _LabelSmoothedNLL(torch.autograd.Function):
    """Summed smoothed cross-entropy with a closed-form backward.

    The gradient of -sum_v q_v log softmax(z)_v with respect to the logits z
    is softmax(z) - q. Writing it directly saves autograd's zero-filled
    (N, V) buffers for ``gather`` and ``sum``: on a CPU the loss of a
    d_model-256 model over an 8k vocabulary then costs half as much.
    """

    @staticmethod
    def forward(ctx, logits, target, pad_id: int, smoothing: float):
        z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (N, V)
        lse = torch.logsumexp(z, dim=1)  # (N,)
        loss = _smoothed_nll(*_row_terms(z, target, pad_id), lse, target, pad_id, smoothing, z.size(-1))
        ctx.save_for_backward(z, lse, target)
        ctx.pad_id, ctx.smoothing, ctx.dtype = pad_id, smoothing, logits.dtype
        return loss.sum()

    @staticmethod
    def backward(ctx, grad_out):
        z, lse, target = ctx.saved_tensors
        p = (z - lse[:, None]).exp_()  # softmax (N, V)
        grad = _softmax_minus_target_(p, target, ctx.pad_id, ctx.smoothing, (target != ctx.pad_id) * grad_out)
        return grad.to(ctx.dtype), None, None, None


def _back_through_generator(p: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias, acc: torch.dtype):
    """The gradients for h (n, C), weight (V, C) and bias (V,) (or None) from the logits' gradient p (n, V)."""
    return p @ weight, p.t() @ h, None if bias is None else p.sum(dim=0, dtype=acc)


def _block(h, t, weight, bias, pad_id: int, smoothing: float, low: torch.dtype | None, with_grad: bool):
    """One block of ``_generator_nll``: rows h (n, C) and their targets t (n,), none of them pad (generator_nll
    passes the real rows only). Returns its summed loss and, ``with_grad``, its gradients for h, weight and bias
    (or None)."""
    acc = torch.promote_types(weight.dtype, torch.float32)
    z = F.linear(h, weight, bias)  # (n, V); under autocast the product is bf16
    # Shift each row by its max (exact in bf16 too), then exponentiate in place. A bf16 product is
    # widened to float32 on the way: on a GPU by the subtraction itself, one kernel; on a CPU by a
    # cast, then the subtraction in place: 0.38 ms against 0.69 for one mixed-precision subtraction
    # of a 256 x 8000 block (RESULTS.md, twenty-sixth session).
    shift = z.amax(dim=1, keepdim=True).to(acc)
    z = z.to(acc).sub_(shift) if eager_on_cpu(z) or z.dtype == acc else torch.sub(z, shift)
    terms = _row_terms(z, t, pad_id)
    row_sum = z.exp_().sum(dim=1)  # z is now exp(z - max) (n, V)
    loss = _smoothed_nll(*terms, row_sum.log(), t, pad_id, smoothing, z.size(-1)).sum()
    if not with_grad:
        return loss, None
    # Under autocast the gradient is made in the products' precision at once (autocast would cast it at
    # each product): its passes move 8 bytes an (n, V) entry where float32 and a cast moved 26, the
    # block's 45 where 63 (benchmarks/gpu_traffic.py's count; a GPU's time here is its memory traffic).
    scale = torch.ones_like(row_sum)  # every row's gradient whole: none is padding
    p = _softmax_minus_target_(z, t, pad_id, smoothing, scale, row_sum) if low is None else \
        _softmax_minus_target_in(low, z, t, pad_id, smoothing, scale, row_sum)
    return loss, _back_through_generator(p, h, weight, bias, acc)


def _block_to_compile(h, t, weight, bias, pad_id: int, smoothing: float, low: torch.dtype | None, with_grad: bool):
    """``_block`` as plain math, for torch.compile (train.compile) to fuse. The gradient's target q is made by
    comparing each column with the row's target and pad, not written in by a scatter, so that inductor makes
    the passes over the (n, V) logits between the products two reductions, one element-wise kernel for the
    gradient and the bias's sum: 10 bytes an entry under bf16 autocast, where ``_block``'s seven eager passes
    move 32 (the whole block: 19 against 41 at n 8,192, V 8,000, C 512; benchmarks/gpu_traffic.py's count).
    Eager, the comparisons would cost passes of their own."""
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
    """``_block_to_compile`` compiled by ``compile`` (torch.compile, or what a test or a benchmark puts in its
    place), made once: making it costs ~3 ms of the host's time, a GPU training step's worth."""
    return compile(_block_to_compile)


def _generator_nll(hidden, weight, bias, target, pad_id: int, smoothing: float, rows: int, with_grad: bool,
                   compiled: bool = False):
    """The summed loss of ``F.linear(hidden, weight, bias)``, ``rows`` positions at a time.

    Each block of logits (rows, V) is made, scored and, ``with_grad``, turned
    into its gradient in place and multiplied back through the output layer
    at once, while it is still in the cache; the (N, V) logits never exist.
    ``compiled``: each block by ``_block_to_compile`` under torch.compile, for any number of rows (compiled
    again once, as dynamic, for the first shorter block).
    Returns the loss and the gradients for hidden, weight and bias (or Nones).
    """
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


CPU_ROWS, GPU_ROWS = 256, 8192  # generator_nll's block of rows by default (its docstring says why)


def generator_nll(hidden: torch.Tensor, generator: torch.nn.Linear, target: torch.Tensor, pad_id: int,
                  smoothing: float, rows: int | None = None, count: int | None = None,
                  compiled: bool = False) -> tuple[torch.Tensor, int]:
    """``label_smoothed_nll(generator(hidden), ...)`` without the (N, V) logits.

    hidden (..., C) the decoder's output, target (...). The output layer and
    the loss go together, ``rows`` positions at a time (the fused
    linear-cross-entropy of Liger Kernel and Cut Cross-Entropy): on a CPU the
    element-wise passes over the logits then run in the cache, not in memory:
    the multi30k model's training step went from 738 to 610 ms (8k vocabulary).
    By default 256 rows on a CPU; on a GPU 8192, since each block costs a dozen
    kernel launches and its memory (8192 x V floats) is no concern there.
    ``count``: the non-pad targets, where the caller has them on the host (a Batch's n_tokens). Counting
    them here reads the device: on a GPU the host would wait for the queued work at every batch.
    Only those rows go through the output layer: a padding row's loss and gradient are zero, and its
    product with the (C, V) weight and its passes over V logits are work for nothing (6% of multi30k's
    target rows at 2,048 tokens a batch, 9% at 32k, 15% at 64k).
    ``compiled``: each block by torch.compile (train.compile), fused.
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


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float
) -> tuple[torch.Tensor, int]:
    """Cross-entropy against ``smoothed_targets``, summed over non-pad targets.

    logits (..., V), target (...). Returns (summed loss, number of non-pad
    targets). Computed without materialising the (N, V) distribution:
    -sum_v q_v log p_v = -(1-e) log p_gold - e/(V-2) (sum_v log p_v - log p_gold - log p_pad).
    With smoothing 0 it is plain cross-entropy.
    """
    V = logits.size(-1)
    target = target.reshape(-1)  # (N,)
    loss = _LabelSmoothedNLL.apply(logits.reshape(-1, V), target, pad_id, smoothing)
    return loss, int((target != pad_id).sum())


def cosine_lr(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr`` at ``total``."""
    if step < warmup:
        return lr * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def weight_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: decay the weight matrices of linear layers only.

    Biases, the norms' gains and embeddings (and the generator when it is tied
    to an embedding) are not decayed.
    """
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay = [p for p in model.parameters() if id(p) in linear_weights and id(p) not in embeddings]
    keep = [p for p in model.parameters() if id(p) not in {id(q) for q in decay}]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
