"""torch.compile counted, not built (gpu_traffic.py --compiled): inductor lowers each graph and fuses its kernels
as for a run, on fake tensors, and each kernel is recorded with inductor's own FLOPs and bytes, named by the line
of the project's code it comes from, in place of the C++ or Triton it would build."""

import contextlib
import re
from functools import partial
from pathlib import Path
from unittest.mock import patch

import torch
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch._inductor.ir import MultiOutput
from torch._inductor.scheduler import BaseSchedulerNode, ExternKernelSchedulerNode, Scheduler
from torch._inductor.virtualized import V
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import flop_registry

from benchmarks.throughput.train_throughput import ROOT

LIB = (str(ROOT / "lib"), str(ROOT / "transformer"))  # the project's own code


class _Counted(Exception):
    """Raised where inductor would write a graph's kernels: they are counted, not built."""


def op_name(target) -> str:
    """An operator's name: "relu" for aten.relu.default."""
    packet = getattr(target, "overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(target, "__name__", str(target))


def kernel_name(node: BaseSchedulerNode) -> str:
    """A kernel of inductor's: an operator it calls (a product: "aten::mm", as the eager count names it), or
    "fused" and the operators it fuses."""
    if isinstance(node, ExternKernelSchedulerNode):
        op = getattr(node.node, "op_overload", None)
        if op is not None:
            return "aten::" + op_name(op)
        # a fallback kernel (the fused attention) may name neither: its IR node's class then
        return "aten::" + (getattr(node.node, "python_kernel_name", None) or type(node.node).__name__).split(".")[-1]
    return "fused " + ",".join(sorted({op_name(o.target) for n in node.get_nodes() if n.node is not None
                                       for o in n.node.get_origins() if o.op == "call_function"}))


def kernel_flops(node: BaseSchedulerNode) -> int:
    """inductor's count of a kernel's FLOPs; for a fallback kernel it does not count (the fused attention),
    torch's flop formula on the shapes of the operator it lowers."""
    flops = node.estimate_flops()
    if flops is not None or not isinstance(node, ExternKernelSchedulerNode) or isinstance(node.node, MultiOutput):
        return flops or 0  # a MultiOutput picks one of a kernel's outputs: the kernel counted them
    for origin in node.node.get_origins():
        packet = getattr(origin.target, "overloadpacket", None)
        if origin.op == "call_function" and packet in flop_registry:
            args, kwargs = tree_map(lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a,
                                    (origin.args, origin.kwargs))
            flops = flop_registry[packet](*args, **kwargs, out_val=origin.meta["val"])
            return int(V.graph.sizevars.optimization_hint(flops))  # a dynamic graph's sizes: this step's
    return 0


def origin_line(node: BaseSchedulerNode) -> str:
    """The line of lib/ that a kernel's operator comes from (a fused kernel's: its first that has one), as
    ``caller`` gives a line."""
    for n in node.get_nodes():
        if n.node is None:
            continue
        own = n.node.get_origin_node()  # the operator it lowers, where it is one
        for origin in [own] if own is not None else sorted(n.node.get_origins(), key=lambda o: o.name):
            frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n +(.+)', origin.meta.get("stack_trace") or "")
            lib = [(file, line, code) for file, line, code in frames if file.startswith(LIB)]
            if lib:
                file, line, code = lib[-1]
                return f"{Path(file).name}:{line} {code.strip()[:70]}"
    return "(no line of lib)"


@contextlib.contextmanager
def counted_compile(traffic):
    """torch.compile counted, not built: each graph is lowered and its kernels fused by inductor as for a run,
    on the fake tensors; each kernel is then recorded with its FLOPs and bytes (inductor's own count: a fused
    kernel reads its inputs and writes its outputs once, what it keeps in registers moves nothing) in place of
    the C++ or Triton it would build. The graph itself runs as it is, with ``traffic`` (gpu_traffic.Traffic)
    paused, and each run adds its kernels to ``traffic``. Each step compiles afresh, its sizes the graphs'
    hints: the counts are its own."""
    def inner_compile(gm, example_inputs, **kwargs):
        part = "backward" if kwargs.get("is_backward") else "forward"
        kernels = []

        def count(scheduler):
            for node in scheduler.nodes:
                name = kernel_name(node)
                kernels.append((name, kernel_flops(node), node.get_read_write_buffers_sizes(),
                                f"{origin_line(node)} (compiled {part}) {name}"))
            raise _Counted

        with patch.object(Scheduler, "codegen", count):
            try:
                compile_fx_inner(gm, example_inputs, **kwargs)
            except Exception as error:  # inductor wraps what a pass raises
                if not isinstance(getattr(error, "inner_exception", error), _Counted):
                    raise

        def run(args):
            traffic.paused = True
            try:
                return gm(*args)
            finally:
                traffic.paused = False
                traffic.ops.extend(kernels)

        run._boxed_call = True  # takes its inputs as one list, as compiled graphs do
        return run

    backend = partial(compile_fx, inner_compile=inner_compile)
    compile = torch.compile
    torch._dynamo.reset()
    try:
        with patch.object(torch, "compile", lambda model, **kw: compile(model, **kw, backend=backend)):
            yield
    finally:
        torch._dynamo.reset()
