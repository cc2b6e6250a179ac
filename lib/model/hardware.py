"""What a training step costs and what the hardware gives: the model's FLOPs, the step's rates, and the
matmul peak and CPU flags that model FLOPs utilisation (MFU) is measured against."""

import time
from pathlib import Path

import torch


def training_flops(cfg, vocab_size: int, src_lengths: list[int], tgt_lengths: list[int]) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3 x forward, 2 FLOPs a multiply-add).

    cfg: the ModelConfig. Counted on the real (unpadded) lengths, as MFU is:
    per layer the projections (per token 2 C Q for queries and output, where Q = H D
    is C unless d_head sets D; 2 C K for keys and values, where K = Q, or less with
    grouped-query attention; 2 C d_ff for the feed-forward, 3 C d_ff for swiglu's)
    and the attention products (2 Q per query-key pair), plus the output layer (C V
    per target token). No source (``src_lengths`` empty): the decoder-only LM, whose
    blocks have no cross attention.
    """
    C, F, Q, K = cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    ffn = (3 if cfg.activation == "swiglu" else 2) * C * F
    # Summed over the batch: only these sums enter (a loop over sentences took ms a step).
    S, SS = sum(src_lengths), sum(s * s for s in src_lengths)
    T, TT = sum(tgt_lengths), sum(t * t for t in tgt_lengths)
    encoder = S * (2 * C * Q + 2 * C * K + ffn) + 2 * SS * Q
    decoder = T * (2 * C * Q + 2 * C * K + ffn) + 2 * TT * Q
    if src_lengths:  # cross attention: queries and output on the target, keys and values on the source
        TS = sum(t * s for t, s in zip(tgt_lengths, src_lengths))
        decoder += T * 2 * C * Q + S * 2 * C * K + 2 * TS * Q
    macs = cfg.encoder_layers * encoder + cfg.decoder_layers * decoder + T * C * vocab_size
    return 3 * 2 * macs


def speed(tokens: int, flops: float, seconds: float, peak_tflops: float) -> dict:
    """Tokens per second and, given the hardware's peak, model FLOPs utilisation."""
    rates = {"train/tokens_per_s": tokens / seconds}
    if peak_tflops > 0:
        rates["train/mfu"] = flops / seconds / (peak_tflops * 1e12)
    return rates


def clock(device: torch.device) -> float:
    """Seconds now, once the device has done the work queued on it (a GPU runs behind the Python code)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    return time.perf_counter()


def product_rate(a: torch.Tensor, b: torch.Tensor, products: int = 1) -> float:
    """FLOP/s of ``products`` back-to-back a @ b products."""
    start = clock(a.device)
    for _ in range(products):
        a @ b
    return products * 2 * a.size(0) * a.size(1) * b.size(1) / (clock(a.device) - start)


# CPU flags (Linux's /proc/cpuinfo) of native bfloat16 matmuls: there bf16 autocast pays off; elsewhere
# a CPU emulates it, more slowly than fp32.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags, from the "flags" line that x86 Linux writes; empty elsewhere (so auto
    precision takes fp32 there)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())


# CPU flags under which torch's bfloat16 products have a kernel of their own (oneDNN's); with AVX2 alone
# they fall back to a generic one, a hundred times slower than float32's.
BF16_KERNEL_FLAGS = NATIVE_BF16_FLAGS | {"avx512f"}


def square_sizes(device: torch.device, dtype: torch.dtype = torch.float32, flags: set[str] | None = None
                 ) -> tuple[int, ...]:
    """Matrix sizes that reach the device's matmul peak in ``dtype``: a GPU needs larger ones to fill it.

    bfloat16 on a CPU whose ``flags`` (default: this CPU's) lack ``BF16_KERNEL_FLAGS`` is as slow at every
    size, and its 2048 products take seconds each: it is timed on 256 x 256 products alone. No flags known (not
    x86 Linux): the usual sizes.
    """
    if device.type == "cuda":
        return 4096, 8192
    flags = cpu_flags() if flags is None else flags
    if dtype == torch.bfloat16 and flags and not flags & BF16_KERNEL_FLAGS:
        return (256,)
    return 1024, 2048


# train.precision's matmul dtype (config.PRECISIONS): what a peak is measured in.
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# The layouts of a training step's products: x @ W.T (nn.Linear's forward), and grad @ W and grad.T @ x
# (its backward). A hardware kernel runs all three alike; a CPU without one for bfloat16 does not.
LAYOUTS = (lambda a, b: (a, b.T), lambda a, b: (a, b), lambda a, b: (a.T, b))


def matmul_peak(dtype: torch.dtype, device: torch.device, repeats: int = 6, sizes: tuple[int, ...] = ()) -> float:
    """The best FLOP/s of square matmuls on this machine, in the given precision: ``repeats`` times four
    products a size (``sizes``, default ``square_sizes``), taking the layouts (``LAYOUTS``) in turn."""
    best = 0.0
    for n in sizes or square_sizes(device, dtype):
        a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
        for layout in LAYOUTS:
            product_rate(*layout(a, b))  # warm-up
        rates = (product_rate(*LAYOUTS[i % len(LAYOUTS)](a, b), products=4) for i in range(repeats))
        best = max(best, *rates)
    return best
