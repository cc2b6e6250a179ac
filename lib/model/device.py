"""Where and how training computes: the device (and the processes under torchrun), the precision, the
CPU allocator's setting, the peak that MFU is measured against, and the message when memory runs out."""

import contextlib
import ctypes
import logging
import re

import torch

from lib.core import distributed
from lib.model.hardware import BF16_KERNEL_FLAGS, NATIVE_BF16_FLAGS, PRECISION_DTYPES, cpu_flags, matmul_peak

log = logging.getLogger(__name__)


def open_device(name: str) -> tuple[torch.device, distributed.Context]:
    """train.device as this process's device, the process group joined under torchrun."""
    device = distributed.local_device(distributed.device_named(name, "train.device"))
    ctx = distributed.setup(device)
    if device.type == "cpu":
        keep_freed_memory()
    return device, ctx


def keep_freed_memory():
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the OS.

    A CPU training step frees and reallocates the same megabyte-sized activations every step; returned to
    the OS, each comes back page-faulted and zero-filled. A no-op where the C library is not glibc.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum: blocks up to 32 MiB come from the heap
    mallopt(m_trim_threshold, 1 << 30)


def resolve_precision(name: str, device: torch.device, flags: set[str] | None = None) -> str:
    """train.precision as fp32 or bf16: auto is bf16 on a CUDA GPU that has it and on a CPU that multiplies
    bfloat16 natively (``flags``, default this CPU's), fp32 elsewhere (Apple silicon's MPS included). Fixed
    for a machine, so that the same params and seed still give the same model there. bf16 asked for by name
    on a CPU whose flags lack it is kept, with a warning: it is the slower there."""
    if device.type == "cuda":
        native = ["bf16"] if torch.cuda.is_bf16_supported() else []
    elif device.type == "mps":  # bf16 autocast there is not what it is on a GPU: auto keeps fp32
        native = []
    else:
        flags = cpu_flags() if flags is None else flags
        native = sorted(flags & NATIVE_BF16_FLAGS)
        if name == "bf16" and flags and not native:  # no flags (not x86 Linux): nothing known, nothing said
            slower = "1.2x" if flags & BF16_KERNEL_FLAGS else "20x"  # AVX-512 without BF16, or AVX2 alone
            log.warning("train.precision: bf16 on a CPU without native bfloat16 (no %s): a step takes about %s "
                        "fp32's time here; auto would take fp32", " or ".join(sorted(NATIVE_BF16_FLAGS)), slower)
    if name != "auto":
        return name
    chosen = "bf16" if native else "fp32"
    why = f"{device.type} has {', '.join(native)}" if native else f"no native bfloat16 on {device.type}"
    log.info("train.precision auto: %s (%s)", chosen, why)
    return chosen


def autocast(precision: str, device: torch.device):
    """The forward pass's precision: bf16 autocast, or nothing changed."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_tflops(given: float | str, precision: str, device: torch.device) -> float:
    """train.peak_tflops as a number: as given, or measured now, in ``precision``, when it is "measure"."""
    if given != "measure":
        return given
    peak = matmul_peak(PRECISION_DTYPES[precision], device, repeats=3) / 1e12
    log.info("train.peak_tflops: measured %.3f TFLOP/s (square %s matmuls on %s)", peak, precision, device)
    return peak


class OutOfMemory(ValueError):
    """The device's memory ran out (a GPU's torch.OutOfMemoryError, or the CPU allocator's refusal): the message
    names the params that size a step, and how to keep the update while halving them."""


def out_of_memory(err: RuntimeError) -> str | None:
    """What ran out and how much was asked ("CUDA out of memory. Tried to allocate 2.00 GiB"), if ``err`` says
    memory ran out: a GPU's torch.OutOfMemoryError, or the CPU allocator's RuntimeError ("DefaultCPUAllocator:
    can't allocate memory: you tried to allocate 80000000000 bytes"); None for any other error."""
    if isinstance(err, torch.OutOfMemoryError):
        return ". ".join(str(err).split(". ")[:2])  # then torch's advice on its allocator's settings
    asked = re.search(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes", str(err))
    return asked and f"CPU out of memory. Tried to allocate {int(asked[1]) / 2 ** 30:.2f} GiB"


def out_of_memory_error(said: str, cfg, batch: str) -> OutOfMemory:
    """The OutOfMemory for ``said`` (``out_of_memory``'s), naming the params that size a step of ``cfg``
    (``batch``: what sizes it, its model family's)."""
    return OutOfMemory(f"{said}: a batch is {batch} and double train.accumulate (now {cfg.accumulate}): an "
                       "update sees as many tokens, in half the memory; or make train.model smaller")
