"""A GPU training step's FLOPs and memory traffic, counted on a machine without a GPU: the roofline.

One training step of the hand-written model, as train_throughput.py takes it (forward and loss under bf16
autocast, backward, clipping, fused Adam), runs on fake tensors (torch's FakeTensorMode: shapes, dtypes and
strides, no data and no memory, so a 60k-token batch of a d_model-512 model costs a second on any CPU). Every
operator it dispatches is recorded with its FLOPs (torch.utils.flop_counter's formulas: the products) and the
bytes it moves: each tensor it reads or writes, counted over the elements its strides reach (a broadcast
row once, not once per use); a view, or an allocation, moves nothing. A GPU's time for the operator is then
at least max(FLOPs / peak, bytes / bandwidth), and the step's, their sum: what it would take were every
kernel at the hardware's limit. "mfu_ceiling" is the MFU of that time (lib.model.hardware.training_flops, on the
real lengths, over it and the peak): no eager run of these operators can do better.

The step takes the GPU's paths, not the CPU's: torch's dropout (one fused kernel, native_dropout, as CUDA
runs it), the attention's and the loss's forms for a GPU (transformer.fast.eager.eager_on_cpu false: attention
is then F.scaled_dot_product_attention, counted as CUDA's memory-efficient kernel), the loss's 8,192-row
blocks, no id check. CPU autocast puts the same operators in bf16 as CUDA's for this model (the
products; the residual stream, its LayerNorms and the softmax stay float32). Against a measurement: the
H200 of 2026-12-04 ran the eager step at 2.2x its roofline, from 32k tokens a batch.

--compiled counts the step as train.compile runs it: the model and the loss's blocks torch.compiled. Inductor
lowers each graph and fuses its kernels as for a GPU run, on the same fake tensors, and each kernel is counted
with inductor's own figures (a fused kernel reads its inputs and writes its outputs once); the C++ or Triton is
never built. Inductor here fuses for a CPU, whose fusion rules are its GPU's in the main (a reduction and the
element-wise work around it in one kernel; the products left to the vendor's library): an estimate of the
GPU's kernels, not them. The optimizer and the clipping stay eager, as in train.compile.

Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/throughput/gpu_traffic.py [--max-tokens 32768 ...] [--batches 10] [--d-model 512]
        [--peak-tflops 989] [--bandwidth 4.8] [--compiled] [--data DIR --tokenizer DIR]
Prints one JSON line per --max-tokens: a step's figures over the first --batches batches (10: those that
train_throughput.py times with its default --steps), "by_kind" (ms and GB by train_throughput's kinds), and
"top_lines" (the forward's lines of lib/, the backward's operators; compiled, each kernel's line of lib/, its
pass and its name) by modelled ms.
"""

import argparse
import contextlib
import json
import traceback
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

import lib.model.losses
import transformer.fast.attention
import transformer.fast.dropout
import transformer.fast.loss
import transformer.layers
from benchmarks.throughput import train_throughput
from benchmarks.throughput.step_profile import kind_of
from benchmarks.throughput.train_throughput import (MODEL_KEYS, ROOT, batch_source, batch_work, model_config, ours_loss,
                                                    positive, train_step)
from transformer.config import ModelConfig
from transformer.fast.compile import compile_model
from transformer.model import build_model
from benchmarks.throughput.inductor_count import LIB, counted_compile
from tools.results import header

TOP = 15  # lines shown
SECTOR = 32  # bytes: the least a GPU reads or writes at a time
SPARSE = ("aten::gather", "aten::scatter_add_", "aten::scatter_", "aten::index_put_", "aten::index",
          "aten::index_select", "aten::embedding")
MOVES_NOTHING = ("aten::detach", "aten::lift_fresh", "aten::_unsafe_view", "aten::empty", "aten::empty_like",
                 "aten::empty_strided", "aten::_local_scalar_dense")


def footprint(t: torch.Tensor) -> int:
    """Bytes a GPU moves to read or write a tensor: the elements its strides reach (an expanded, stride-0,
    dimension's once), each scattered element a whole memory sector (a column of a matrix is a sector a row)."""
    if t.numel() == 0:
        return 0
    span = (1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))) * t.element_size()
    return min(span, t.numel() * max(t.element_size(), SECTOR))


def moved(name: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> int:
    """Bytes an operator reads and writes. An in-place one's result is its first input, read and written.
    Gathers and scatters (``SPARSE``) touch of their first input only the elements their index names."""
    if name not in SPARSE:
        return sum(map(footprint, ins + outs))
    index = next(t for t in ins if not t.is_floating_point())
    in_place = name.endswith("_")
    values = ins[-1] if in_place else outs[0]  # what is scattered, or what was gathered
    touched = min(footprint(ins[0]), max(footprint(values), index.numel() * SECTOR))
    return touched + sum(map(footprint, ins[1:])) + (touched if in_place else sum(map(footprint, outs)))


def caller() -> str | None:
    """The innermost line of lib/, or of train_throughput's step, that called the operator."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(LIB) or frame.filename == train_throughput.__file__:
            return f"{Path(frame.filename).name}:{frame.lineno} {(frame.line or '').strip()[:70]}"
    return None


class Traffic(TorchDispatchMode):
    """Each operator that computes: (name, FLOPs, bytes read and written, the line that called it: for the
    backward pass, which autograd's engine runs, the operator and its dtype). Under ``counted_compile`` a
    compiled graph's kernels, as inductor made them, instead of its operators."""

    def __init__(self):
        super().__init__()
        self.ops = []
        self.paused = False  # while a compiled graph runs

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # torch.compile traces and compiles with this mode off (and compiles at all with it on)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused:
            return out
        name = str(func._overloadpacket).replace("aten.", "aten::")
        if (func.is_view and not func._schema.is_mutable) or name.startswith("prim.") or name in MOVES_NOTHING:
            return out
        read = (args, {k: v for k, v in kwargs.items() if k != "out"})  # an out= tensor is written, not read
        ins, outs = ([t for t in tree_leaves(x) if isinstance(t, torch.Tensor)] for x in (read, out))
        if not ins + outs:
            return out
        flops = flop_registry[func._overloadpacket](*args, **kwargs, out_val=out) \
            if func._overloadpacket in flop_registry else 0
        where = caller()
        if where is None or where.endswith("backward()"):  # autograd's engine: by operator
            where = f"{where or ''} {name} {(ins + outs)[0].dtype}".strip()
        self.ops.append((name, flops, moved(name, ins, outs), where))
        return out


def efficient_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, enable_gqa: bool = False):
    """F.scaled_dot_product_attention as CUDA runs it with a mask: the memory-efficient kernel (the scores never
    in memory), the boolean mask made an additive bias first, grouped key/value heads repeated."""
    if enable_gqa:
        k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
    bias = attn_mask
    if attn_mask is not None and not attn_mask.is_floating_point():
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill(~attn_mask, float("-inf"))
    if bias is not None:
        bias = bias.to(q.dtype).expand(q.size(0), q.size(1), q.size(2), k.size(2))
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, torch.is_grad_enabled(), dropout_p)[0]


@contextlib.contextmanager
def gpu_paths():
    """The model's and the loss's GPU forms on fake CPU tensors (see the module's docstring)."""
    dropout = lambda x, p=0.5, training=True, inplace=False: torch.native_dropout(x, p, training)[0]  # noqa: E731 - a one-line helper, named where it is used
    patches = [(module, "eager_on_cpu", lambda x: False)
               for module in (transformer.fast.dropout, transformer.fast.attention, transformer.fast.loss)]
    patches += [(transformer.layers.Embedding, "check_ids", lambda self, ids, start: None), (F, "dropout", dropout),
                (F, "scaled_dot_product_attention", efficient_attention),
                (lib.model.losses, "generator_nll",
                 partial(transformer.fast.loss.generator_nll, rows=transformer.fast.loss.GPU_ROWS))]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def step_traffic(cfg: ModelConfig, vocab_size: int, batch, ids, compiled: bool = False) -> list[tuple]:
    """The operators of one bf16 training step on ``batch``, on fake tensors, as a run takes it after its first:
    a first step, not counted, makes Adam's state (and compiles). ``compiled``, as train.compile runs it: the
    model and the loss's blocks compiled, their kernels counted (``counted_compile``)."""
    traffic = Traffic()
    with FakeTensorMode(allow_non_fake_inputs=True), gpu_paths(), \
            counted_compile(traffic) if compiled else contextlib.nullcontext():
        model = build_model(cfg, "seq2seq", vocab_size, vocab_size, joint_vocab=True, fast=True)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
        step = partial(train_step, compile_model(model, "seq2seq") if compiled else model,
                       partial(ours_loss, compiled=compiled), optimizer, batch, ids, "bf16")
        step()
        traffic.ops.clear()  # the first step's compiled kernels
        with traffic:
            step()
    return traffic.ops


def roofline(ops: list[tuple], peak_tflops: float, bandwidth: float, model_flops: float, steps: int = 1) -> dict:
    """The modelled time of ``ops`` (those of ``steps`` steps, ``model_flops`` theirs) at ``peak_tflops`` and
    ``bandwidth`` (TB/s), a step's, by kind and by line."""
    seconds = lambda flops, moved: max(flops / (peak_tflops * 1e12), moved / (bandwidth * 1e12))  # noqa: E731 - a one-line helper, named where it is used
    kinds, lines = defaultdict(lambda: [0.0, 0.0]), defaultdict(lambda: [0.0, 0.0])
    for name, flops, moved, where in ops:
        for totals in (kinds[kind_of(name)], lines[where]):
            totals[0] += seconds(flops, moved)
            totals[1] += moved
    total = sum(s for s, _ in kinds.values())

    def shown(totals: list[float]) -> dict:
        return {"ms": round(totals[0] * 1000 / steps, 3), "gb": round(totals[1] / 1e9 / steps, 3)}

    return {
        "ops": round(len(ops) / steps), "tflop": round(sum(op[1] for op in ops) / 1e12 / steps, 4),
        "model_tflop": round(model_flops / 1e12 / steps, 4), "gb": round(sum(op[2] for op in ops) / 1e9 / steps, 3),
        "modelled_ms": round(total * 1000 / steps, 3),
        "mfu_ceiling": round(model_flops / total / (peak_tflops * 1e12), 3),
        "by_kind": {kind: shown(t) for kind, t in sorted(kinds.items(), key=lambda kv: -kv[1][0])},
        "top_lines": [[where, *shown(t).values()]
                      for where, t in sorted(lines.items(), key=lambda kv: -kv[1][0])[:TOP]],
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--d-ff", type=int, default=None, help="default: 4 x --d-model")
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--activation-dropout", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=positive(int), nargs="+", default=[32768],
                        help="as gpu_check.sh's MAX_TOKENS")
    parser.add_argument("--batches", type=positive(int), default=10,
                        help="steps modelled, each on its own batch: train_throughput's first --steps batches")
    parser.add_argument("--peak-tflops", type=positive(float), default=989.0, help="dense bf16 (H100/H200 SXM: 989)")
    parser.add_argument("--bandwidth", type=positive(float), default=4.8, help="memory bandwidth, TB/s (H200: 4.8)")
    parser.add_argument("--compiled", action="store_true",
                        help="the step as train.compile runs it: the model and the loss's blocks compiled, each "
                             "graph's kernels as inductor fuses them (~45 s a batch of a CPU's time)")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "multi30k", help="the prepared multi30k data")
    parser.add_argument("--tokenizer", type=Path, default=ROOT / "models" / "multi30k" / "tokenizer")
    return parser.parse_args()


def main():
    args = parse_args()
    args.d_ff = args.d_ff or 4 * args.d_model
    cfg = model_config(args)
    batches_at, ids, V, source = batch_source(args.data, args.tokenizer, args.batches)
    for max_tokens in args.max_tokens:
        batches = batches_at(max_tokens)
        ops, tokens, flops = [], 0, 0.0
        for batch in batches:
            ops += step_traffic(cfg, V, batch, ids, args.compiled)
            batch_tokens, batch_flops = batch_work(cfg, V, batch, ids)
            tokens, flops = tokens + batch_tokens, flops + batch_flops
        print(json.dumps({
            **header("gpu_traffic"),
            "batches": source, "model": {k: getattr(cfg, k) for k in MODEL_KEYS},
            "compiled": args.compiled, "max_tokens": max_tokens, "steps": len(batches),
            "tokens_per_step": round(tokens / len(batches)),
            "peak_tflops": args.peak_tflops, "bandwidth_tb_s": args.bandwidth,
            **roofline(ops, args.peak_tflops, args.bandwidth, flops, len(batches)),
        }), flush=True)


if __name__ == "__main__":
    main()
