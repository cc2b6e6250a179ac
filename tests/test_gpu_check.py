"""tools/gpu_check.sh, run as a dry run on a CPU: a GPU machine is lent rarely and briefly, so the
script that uses it must not first fail there on a renamed param or a moved file."""

import dataclasses
import json
import os
import sys

import pytest
import torch

from tests.conftest import ROOT, run_tree
from tests.test_multi30k import write_corpus


# Every python the script starts runs this first. It swaps torch.compile for one that fails at the first
# step, as a compiler does, once torch is imported: the script's pythons that never import torch are
# spared the 3 s import.
SITECUSTOMIZE = """\
import importlib.abc
import importlib.util
import sys


def broken_compile(model, **kwargs):
    import torch

    class Compiled(torch.nn.Module):  # as torch.compile's module: the model's parameters, a call that fails
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args, **kwargs):
            raise RuntimeError('no compiler here: a stand-in for one that fails')
    return Compiled()


class BreakCompileOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.compile = broken_compile
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, BreakCompileOnImport())
"""


@pytest.mark.slow
def test_gpu_check_runs_every_step_and_summarises(tmp_path):
    """The whole script, compiling (COMPILE=1), with its way out when compiling fails: here the compiled
    model always raises (inductor's C++ build would take minutes on 2 cores), so the compiled training
    stops at its first step and the script trains eager instead, both paths run."""
    work, site = tmp_path / "work", tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE": "cpu", "MINUTES": "0.01", "D_MODEL": "32",
           "LAYERS": "1", "MAX_TOKENS": "256", "COMPILE": "1", "PEAK_TFLOPS": "0.001",
           "MULTI30K": str(write_corpus(tmp_path / "raw")), "WORK": str(work), "PYTHONPATH": str(site)}
    result = run_tree(["bash", "tools/gpu_check.sh"], timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "installing" not in result.stdout  # this environment lacks nothing
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary == json.loads((work / "summary.json").read_text())
    assert summary["cuda_tests"] == "passed" and summary["device"] == "cpu" and summary["torch"] == torch.__version__
    train, throughput = summary["train"], summary["throughput"]
    base = summary["base_recipe"]  # the paper's base model, smoke-sized on a CPU
    assert base["tokens_per_s"] > 0 and base["peak_memory_gb"] > 0 and base["hours_to_100k_steps"] > 0
    assert train["epochs"] >= 1 and train["steps"] >= 1 and train["tokens_per_s_median"] > 0
    assert 0 < train["mfu_median"] and 0 < train["best_valid_loss"] < 20
    assert [b["max_tokens"] for b in throughput] == [64, 256, 512]  # a quarter of, at and twice MAX_TOKENS
    assert all(b["tokens_per_s"]["ours"] > 0 and b["matmul_peak_tflops"] > 0 for b in throughput)
    for b in throughput:  # where each model's step time went: every operator's own time in one kind or another
        for name, profiled in b["profile"].items():
            shares = profiled["kinds_share"]
            # the products found among the operators (their share of a tiny model's step varies with the load)
            assert 0 < profiled["busy_ms"] <= profiled["step_ms"] * 1.05 and shares["matmul"] > 0, (name, profiled)
            assert abs(sum(shares.values()) - 1) < 0.01, (name, shares)
            assert profiled["matmul_tflops"] > 0, (name, profiled)  # the products' own rate, in the summary
    # The compiled step fails as the compiled training does: the summary says why, and the training still ran.
    assert summary["compiled_step"] == {"error": "RuntimeError: no compiler here: a stand-in for one that fails"}
    assert "the compiled step failed" in result.stderr
    assert (work / "model.pt").is_file()
    assert train["compile"] == "failed" and "training eager instead" in result.stderr
    # The error ends the log that the script shows the end of: no noise from the interpreter's teardown after it.
    failed = (work / "train-compiled.log").read_text().rstrip()
    assert failed.endswith("RuntimeError: no compiler here: a stand-in for one that fails"), failed[-1500:]


def test_a_python_lacking_the_requirements_is_told_each(tmp_path):
    """On the H200 the script stopped at its first step: its python lacked ruamel, and looking up
    `ruamel.yaml` raised ModuleNotFoundError instead of saying it is missing. A python that sees no
    site-packages (`-S`) lacks every requirement: each is named, but torch and those the check never runs."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    script = 'source <(sed -n "/^missing_requirements()/,/^}/p" tools/gpu_check.sh); missing_requirements'
    result = run_tree(["bash", "-c", script], timeout=60, cwd=ROOT, env={**os.environ, "PYTHON": str(python)})
    assert result.returncode == 0, result.stderr
    wanted = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert result.stdout.split() == [req for req in wanted
                                     if req and not req.startswith(("torch", "datasets", "import-linter",
                                                                     "pip-tools", "transformers"))]


def test_a_profile_that_records_no_time_still_gives_its_figures():
    """On a GPU whose profiler interface (CUPTI) is missing no kernel is recorded: the profile must still
    give a line (its shares None), not stop gpu_check.sh before its training on a division by zero."""
    from benchmarks.throughput.step_profile import profile

    result = profile([lambda: None], torch.device("cpu"))
    assert result["busy_ms"] == 0 and set(result["kinds_share"].values()) == {None}
    assert result["top_ops"] == [] and result["step_ms"] >= 0


def test_a_profile_that_fails_says_why_and_spares_the_rest(monkeypatch):
    """The profile's CUDA half runs only on a lent GPU: should the profiler fail there, the throughput line
    still comes, saying why, and gpu_check.sh goes on to its training."""
    from benchmarks.throughput import step_profile

    def broken(steps, device):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")
    monkeypatch.setattr(step_profile, "profile", broken)
    assert step_profile.profile_or_why([], torch.device("cpu")) == {
        "error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}


def test_a_profile_gives_the_products_rate_by_shape():
    """The H200's step ran at 0.12-0.15 MFU with no way to tell slow GEMMs from time spent elsewhere: the
    profile gives the products' own rate, and each shape's. Two steps of one known product and a smaller one:
    each shape's FLOPs (rate x time) are its own, 2 n^3 a call."""
    from benchmarks.throughput.step_profile import profile

    big, small = torch.randn(512, 512), torch.randn(8, 128, 128)  # ms each: the rounding (to 1 us) stays small
    result = profile([lambda: (big @ big, torch.bmm(small, small), big + big)] * 2, torch.device("cpu"))
    rows = {name: (shapes, calls, ms, rate) for name, shapes, calls, ms, rate in result["top_matmuls"]}
    assert set(rows) == {"aten::mm", "aten::bmm"}, result["top_matmuls"]  # the addition is no product
    flops = {"aten::mm": 2 * 512**3, "aten::bmm": 8 * 2 * 128**3}
    for name, shapes in (("aten::mm", [[512, 512], [512, 512]]), ("aten::bmm", [[8, 128, 128]] * 2)):
        got_shapes, calls, ms, rate = rows[name]
        assert got_shapes == shapes and calls == 1 and ms > 0
        assert abs(rate * 1e9 * ms / flops[name] - 1) < 0.02, (name, rate, ms)
    seconds = result["kinds_ms"]["matmul"] / 1000  # the products' time in the pass that records no shapes
    assert abs(result["matmul_tflops"] * 1e12 * seconds / sum(flops.values()) - 1) < 0.02, result


def test_a_profile_times_the_step_where_no_shapes_are_recorded(monkeypatch):
    """Recording input shapes keeps a CPU's allocator from reusing freed memory: under it multi30k's bf16 step
    took 78k page faults against 3k, its casts ran 8x slower and "cast_and_copy" read 43% of the step where it
    was 13%. The profile's times come from a pass that records no shapes, the products' shapes and FLOPs from a
    second one. A stand-in profiler whose shaped pass reports every operator 5x slower."""
    from benchmarks.throughput import step_profile

    class Event:
        def __init__(self, key, ms, shapes=None, flops=0):
            self.key, self.count, self.self_cpu_time_total = key, 2, ms * 1000 * 2  # 2 steps, us in all
            self.input_shapes, self.flops, self.device_type = shapes, flops * 2, torch.autograd.DeviceType.CPU

    class Profiler:
        passes = []

        def __init__(self, activities, record_shapes=False, with_flops=False):
            self.shaped = record_shapes and with_flops
            Profiler.passes.append(self.shaped)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self, group_by_input_shape=False):
            slower = 5 if self.shaped else 1
            return [Event("aten::copy_", 2.0 * slower, [[4, 4], [4, 4]]),
                    Event("aten::mm", 4.0 * slower, [[512, 512], [512, 512]], 2 * 512**3 if self.shaped else 0)]

    monkeypatch.setattr(torch.profiler, "profile", Profiler)
    result = step_profile.profile([lambda: None] * 2, torch.device("cpu"))
    assert Profiler.passes == [False, True]
    assert result["kinds_ms"]["cast_and_copy"] == 2.0 and result["kinds_ms"]["matmul"] == 4.0, result
    assert result["kinds_share"]["matmul"] == round(4 / 6, 3) and result["top_ops"][0] == ["aten::mm", 1.0, 4.0]
    assert result["matmul_tflops"] == float(f"{2 * 512**3 / 4.0 / 1e9:.3g}"), result  # shaped FLOPs, unshaped time
    assert result["top_matmuls"] == [["aten::mm", [[512, 512], [512, 512]], 1.0, 20.0,
                                      float(f"{2 * 512**3 / 20.0 / 1e9:.3g}")]]  # the shaped pass's, as said


def test_gpu_traffic_counts_what_each_operator_moves():
    """The roofline's bytes (benchmarks/throughput/gpu_traffic.py): a dense operator reads and writes each of its
    tensors once, a broadcast row once; a column of a matrix costs a memory sector a row, not the matrix; a gather
    touches of its source what its index names; a view moves nothing. Its FLOPs are the products'."""
    from benchmarks.throughput.gpu_traffic import Traffic

    meta = lambda *shape, dtype=torch.float32: torch.empty(*shape, dtype=dtype, device="meta")  # noqa: E731 - a one-line helper, named where it is used
    a, m = meta(1000), meta(1000, 8000)
    with Traffic() as traffic:
        a + a
        m + meta(8000)
        m[:, 3].add_(a)
        m.gather(1, meta(1000, 1, dtype=torch.long))
        m.view(8000, 1000).t()
        meta(64, 32) @ meta(32, 16)
    assert [op[:3] for op in traffic.ops] == [
        ("aten::add", 0, 3 * 4000), ("aten::add", 0, 2 * 32_000_000 + 32_000), ("aten::add_", 0, 2 * 32_000 + 4000),
        ("aten::gather", 0, 32_000 + 8000 + 4000), ("aten::mm", 2 * 64 * 32 * 16, 4 * (64 * 32 + 32 * 16 + 64 * 16))]


def small_step():
    """A small model's config, vocabulary size, special ids, and a batch of 6 pairs without padding."""
    from transformer.config import ModelConfig
    from lib.data.pairs import Batch
    from lib.data.tokenizer import SpecialIds

    cfg = ModelConfig(d_model=32, n_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64, dropout=0.1,
                      norm_first=False, tie_embeddings=True, fused_qkv=True, max_len=32, activation_dropout=0.1)
    ids, V = SpecialIds(pad=0, bos=1, eos=2, unk=3), 50
    src, tgt = torch.randint(4, V, (6, 9)), torch.randint(4, V, (6, 7))
    return cfg, V, ids, Batch(src, torch.cat([torch.full((6, 1), ids.bos), tgt[:, :-1]], 1), tgt, tgt.numel())


def test_gpu_traffic_takes_the_gpu_step_that_mfu_counts():
    """One training step of a small model on fake tensors, on the GPU's paths: the products it runs are those
    that lib.model.hardware.training_flops counts for MFU (a batch without padding), its dropout is torch's fused
    one, its attention CUDA's memory-efficient kernel (zeroing fully masked rows, which a CPU skips), its Adam
    has its state; and lib is as it was after it."""
    import transformer.fast.attention
    import transformer.fast.dropout
    from benchmarks.throughput import gpu_traffic
    from lib.model.hardware import training_flops

    cfg, V, ids, batch = small_step()
    before = transformer.fast.dropout.eager_on_cpu, transformer.fast.attention.eager_on_cpu, torch.nn.functional.dropout
    ops = gpu_traffic.step_traffic(cfg, V, batch, ids)
    after = transformer.fast.dropout.eager_on_cpu, transformer.fast.attention.eager_on_cpu, torch.nn.functional.dropout
    assert after == before
    flops = training_flops(cfg, V, [9] * 6, [7] * 6)
    # The fused attention's backward computes Q K^T again (2 B Tq Tk C FLOPs a call), work MFU does not count
    recomputed = 2 * 6 * cfg.d_model * (2 * 9 * 9 + 2 * (7 * 7 + 7 * 9))  # 2 encoder layers; 2 decoder, self and cross
    assert sum(op[1] for op in ops) == flops + recomputed
    names = {op[0] for op in ops}
    assert "aten::_scaled_dot_product_efficient_attention" in names
    assert "aten::native_dropout" in names and not names & {"aten::random_", "aten::bernoulli_"}, names
    assert "aten::masked_fill" in names and "aten::_fused_adam_" in names
    assert "aten::zeros_like" not in names  # Adam's state, made by a run's first step only: not this one's
    result = gpu_traffic.roofline(ops, 0.1, 0.01, flops)  # a slow device: figures of many digits
    seconds = sum(max(op_flops / 0.1e12, moved / 0.01e12) for _, op_flops, moved, _ in ops)
    assert result["modelled_ms"] == round(seconds * 1000, 3)
    assert result["mfu_ceiling"] == round(flops / seconds / 0.1e12, 3)
    assert abs(sum(kind["ms"] for kind in result["by_kind"].values()) - result["modelled_ms"]) < 0.01
    assert gpu_traffic.roofline(ops * 3, 0.1, 0.01, 3 * flops, steps=3) == result  # figures a step


@pytest.mark.slow
def test_gpu_traffic_counts_the_compiled_step_as_inductor_fuses_it(monkeypatch):
    """--compiled: the step as train.compile runs it, each graph's kernels as inductor fuses them, counted and
    never built. Its products are the eager step's, each loss block's counted at each call (blocks of 16 rows:
    16, 16 and a shorter one, its own graph); the model's and the loss's operators all run compiled, the
    optimizer eager; fused, the step moves less; and torch.compile is torch's again after it."""
    import transformer.fast.loss
    from benchmarks.throughput import gpu_traffic
    from tests.conftest import torch_compile_defaults

    cfg, V, ids, batch = small_step()
    cfg = dataclasses.replace(cfg, encoder_layers=1, decoder_layers=1)  # a graph half as long to compile
    monkeypatch.setattr(transformer.fast.loss, "GPU_ROWS", 16)  # 42 targets: 3 blocks
    compile = torch.compile
    eager = gpu_traffic.step_traffic(cfg, V, batch, ids)
    with torch_compile_defaults():
        compiled = gpu_traffic.step_traffic(cfg, V, batch, ids, compiled=True)
    assert torch.compile is compile
    assert sum(op[1] for op in compiled) == sum(op[1] for op in eager)
    lines = [where for *_, where in compiled]
    assert sum("loss.py" in w and "(compiled forward) aten::mm" in w for w in lines) == 3 * 2, lines
    eager_ops = {(name, where.split(":")[0]) for name, _, _, where in compiled if "(compiled " not in where}
    assert not {name for name, _ in eager_ops} & {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
    assert not {file for _, file in eager_ops} & {"model.py", "layers.py", "attention.py", "dropout.py"}, eager_ops
    assert ("aten::_fused_adam_", "train_throughput.py") in eager_ops
    assert sum(op[2] for op in compiled) < 0.9 * sum(op[2] for op in eager)


TRAFFIC, THROUGHPUT = "benchmarks.throughput.gpu_traffic", "benchmarks.throughput.train_throughput"


@pytest.mark.parametrize("script, arg, what", [
    (TRAFFIC, "--batches", "above 0"), (TRAFFIC, "--peak-tflops", "above 0"), (TRAFFIC, "--bandwidth", "above 0"),
    (TRAFFIC, "--max-tokens", "above 0"), (THROUGHPUT, "--steps", "above 0"), (THROUGHPUT, "--rounds", "above 0"),
    (THROUGHPUT, "--max-tokens", "above 0"), (THROUGHPUT, "--profile", "0 or more")])
def test_a_benchmark_refuses_a_count_or_rate_it_cannot_take(script, arg, what, monkeypatch, capsys):
    """A count or rate of 0 divided by zero after the work (a traceback), a negative --profile stopped
    islice: each is named before any work."""
    import importlib

    value = "-1" if what == "0 or more" else "0"
    monkeypatch.setattr(sys, "argv", [f"{script.split('.')[-1]}.py", arg, value])
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(script).parse_args()
    assert stop.value.code == 2 and f"argument {arg}: {value}: must be {what}" in capsys.readouterr().err
