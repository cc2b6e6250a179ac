"""Where a training step's time goes (train_throughput.py --profile, gpu_check.sh): torch.profiler's operators by
kind (the products, softmax, norms, dropout, casts and copies, the optimizer), the products' own rate by shape,
and on a GPU the kernels themselves."""

import torch

from lib.model.hardware import clock


# Operators by what they do, for --profile; the first kind whose names match wins, the rest is "other".
KINDS = {
    "matmul": ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::_addmm_activation"),
    "softmax": ("softmax",),  # attention's, and the loss's log-softmax, forward and backward
    "norm": ("layer_norm", "rms_norm"),
    "dropout": ("dropout", "bernoulli", "random_"),
    "cast_and_copy": ("aten::copy_", "aten::_to_copy", "aten::cat", "aten::index"),
    "optimizer": ("_fused_adam", "_foreach", "aten::linalg_vector_norm"),
}


def kind_of(op: str) -> str:
    for kind, names in KINDS.items():
        if op in names or any(name in op for name in names if not name.startswith("aten::")):
            return kind
    return "other"


def _profiled(steps, device: torch.device, **options) -> tuple[torch.profiler.profile, float]:
    """``steps`` run once under torch.profiler (``options`` its own); the profiler and the seconds they took."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    start = clock(device)
    with torch.profiler.profile(activities=activities, **options) as prof:
        for step in steps:
            step()
        clock(device)  # the queued kernels are recorded before the profile ends
    return prof, clock(device) - start


def profile(steps, device: torch.device) -> dict:
    """Where the time of ``steps`` (callables, one a step) goes: ms a step by kind and by operator.

    Two passes over the steps. The times come from one that records no input shapes: recording them keeps
    a CPU's allocator from reusing what a step frees, so each new tensor is taken as fresh pages (multi30k's
    bf16 step on a 2-core EPYC: 78k page faults a step against 3k, its casts, which first touch their
    outputs, 8x slower, the step over twice as long). The products' shapes and FLOPs come from a second pass,
    so "top_matmuls"' times are that pass's, on a CPU slowed alike; "matmul_tflops" is the products' FLOPs
    over the first pass's time. A GPU's kernel times are its own in both."""
    n = len(steps)
    prof, seconds = _profiled(steps, device)
    own = (lambda e: e.self_device_time_total) if device.type == "cuda" else (lambda e: e.self_cpu_time_total)
    events = prof.key_averages()
    ops = [(e.key, e.count / n, own(e) / 1000 / n) for e in events if e.device_type.name == "CPU" and own(e) > 0]
    kinds = dict.fromkeys([*KINDS, "other"], 0.0)
    for name, _, ms in ops:
        kinds[kind_of(name)] += ms
    busy = sum(kinds.values())
    top = lambda rows: [[name, round(calls, 1), round(ms, 3)] for name, calls, ms  # noqa: E731 - a one-line helper, named where it is used
                        in sorted(rows, key=lambda row: -row[2])[:12]]
    result = {"step_ms": round(seconds * 1000 / n, 2), "busy_ms": round(busy, 2),
              "ops_per_step": round(sum(calls for _, calls, _ in ops)),
              "kinds_ms": {kind: round(ms, 3) for kind, ms in kinds.items()},
              # None where nothing was recorded (a GPU whose profiler interface, CUPTI, is missing records no kernels)
              "kinds_share": {kind: round(ms / busy, 3) if busy else None for kind, ms in kinds.items()},
              "top_ops": top(ops)}
    # The products' own rate, by shape: a GEMM whose output has few tiles (a 512 x 512 weight's gradient, summed
    # over 50k tokens) can leave most of a GPU idle however fast its square products are.
    shaped, _ = _profiled(steps, device, record_shapes=True, with_flops=True)
    products = [(e.key, e.input_shapes, e.count / n, own(e) / 1000 / n, e.flops / n)
                for e in shaped.key_averages(group_by_input_shape=True)
                if e.device_type.name == "CPU" and e.flops and kind_of(e.key) == "matmul"]
    # TFLOP/s to 3 significant figures: a small model's products on a busy CPU run at under 0.0005
    tflops = lambda flops, ms: float(f"{flops / ms / 1e9:.3g}") if ms else None  # noqa: E731 - a one-line helper, named where it is used
    counted = {name for name, *_ in products}  # the products whose FLOPs the profiler counts, timed unshaped
    result["matmul_tflops"] = tflops(sum(f for *_, f in products), sum(ms for name, _, ms in ops if name in counted))
    result["top_matmuls"] = [[name, shapes, round(calls, 1), round(ms, 3), tflops(f, ms)]
                             for name, shapes, calls, ms, f in sorted(products, key=lambda row: -row[3])[:10]]
    if device.type == "cuda":  # the kernels themselves: which GEMMs, which element-wise passes
        result["top_kernels"] = top([(e.key[:120], e.count / n, e.self_device_time_total / 1000 / n)
                                     for e in events if e.device_type.name == "CUDA"])
    return result


def profile_or_why(steps, device: torch.device) -> dict:
    """``profile``, or why there is none: the figures measured before it stand without it (on a GPU lent for
    minutes, the training that gpu_check.sh runs next must not be lost to a profiler that fails)."""
    try:
        return profile(steps, device)
    except Exception as err:  # noqa: BLE001 - said in the output, not hidden
        return {"error": f"{type(err).__name__}: {err}"}
