"""Training loops with resume (sec. 5 of the paper; nanoGPT's recipe for the LM).

Two flat loops share one scaffold (``Session``): the encoder-decoder trains by
epochs over token-budget batches with Adam, Noam warmup and label smoothing;
the decoder-only LM trains by iterations over random contiguous blocks with
AdamW and a cosine or Noam schedule. Both log per-step metrics through dvclive
into ``live_dir``, keep resumable checkpoints (weights, optimizer, step, RNG
states, config, best validation loss) in ``checkpoint_dir``, and write the
best weights by validation loss to ``model_path``.
Dims: B batch, T block length, V vocabulary.
"""

import ast
import contextlib
import ctypes
import hashlib
import io
import json
import logging
import math
import re
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
import torch.fx.experimental._config
import torch.nn.functional as F
from dvclive import Live
from tqdm import tqdm

from lib import checkpoint, distributed
from lib.config import LR_PARAM, ConfigError, LMTrainConfig, TrainConfig, first_few, flatten
from lib.data import Pairs, collate, read_split, read_text, to_device, token_budget_batches
from lib.masks import padding_mask, target_mask
from lib.metrics import (BF16_KERNEL_FLAGS, NATIVE_BF16_FLAGS, PRECISION_DTYPES, cpu_flags, matmul_peak, perplexity,
                         speed, training_flops)
from lib.model import build_model, parameter_counts, repeats_input
from lib.optim import cosine_lr, generator_nll, noam_lr, weight_decay_groups
from lib.tasks import get_task
from lib.tokenizer import SpecialIds, encode_pairs, encode_text, load_tokenizers, special_ids

log = logging.getLogger(__name__)

# Params that change how a run is logged, saved or computed (compiled kernels), not the model it trains:
# changing them continues a run.
RUN_KEYS = ("peak_tflops", "checkpoint_every", "compile")


def compile_model(model: torch.nn.Module, kind: str) -> torch.nn.Module:
    """``torch.compile`` for training (train.compile); it compiles at the first call.

    A seq2seq's token-budget batches vary in shape, so it is compiled for any
    shape at once (``dynamic``), each size its own symbol. By default sizes that
    are equal in the first batch share one ("duck sizing"): a first batch with
    as many source as target tokens would compile a graph for S == T only, and
    the first batch where they differ would compile it again (minutes on a CPU).
    ``dynamic`` also makes each float attribute (LayerNorm's eps, the embedding
    scale) an input; the first one a kernel needs as a constant restarts the
    whole trace, so floats are taken as constants from the start: a third less
    compile time (RESULTS.md).
    """
    if kind == "seq2seq":
        torch.fx.experimental._config.use_duck_shape = False  # the switch the recompile log names
        torch._dynamo.config.specialize_float = True  # the restart's log names LayerNorm's eps
    return torch.compile(model, dynamic=kind == "seq2seq")


def resolve_precision(name: str, device: torch.device, flags: set[str] | None = None) -> str:
    """train.precision as fp32 or bf16: auto is bf16 on a GPU that has it and on a CPU that multiplies
    bfloat16 natively (``flags``, default this CPU's), fp32 elsewhere. Fixed for a machine, so that the
    same params and seed still give the same model there. bf16 asked for by name on a CPU whose flags lack
    it is kept, with a warning: it is the slower there."""
    if device.type == "cuda":
        native = ["bf16"] if torch.cuda.is_bf16_supported() else []
    else:
        flags = cpu_flags() if flags is None else flags
        native = sorted(flags & NATIVE_BF16_FLAGS)
        if name == "bf16" and flags and not native:  # no flags (not x86 Linux): nothing known, nothing said
            slower = "1.2x" if flags & BF16_KERNEL_FLAGS else "20x"  # AVX-512 without BF16 / AVX2 alone (RESULTS.md)
            log.warning("train.precision: bf16 on a CPU without native bfloat16 (no %s): a step takes about %s "
                        "fp32's time here; auto would take fp32", " or ".join(sorted(NATIVE_BF16_FLAGS)), slower)
    if name != "auto":
        return name
    chosen = "bf16" if native else "fp32"
    why = f"{device.type} has {', '.join(native)}" if native else f"no native bfloat16 on {device.type}"
    log.info("train.precision auto: %s (%s)", chosen, why)
    return chosen


def keep_freed_memory():
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the OS.

    A CPU training step frees and reallocates the same megabyte-sized activations
    every step. By default glibc unmaps such blocks (or trims them off the heap) and
    the next step page-faults them back in, zero-filled by the kernel: ~1,000 faults
    a step at the LM's nanoGPT shape, visible as elementwise ops running 2-4x slower
    on fresh memory. Fixing the mmap threshold at 32 MiB (glibc's maximum) and
    trimming only above 1 GiB keeps those blocks in the heap. A no-op where the C
    library is not glibc; CUDA memory has its own caching allocator.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)


def fingerprint(paths: list[Path]) -> str:
    """sha256 over the contents of files and directory trees, in a stable order."""
    digest = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
        for file in files:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def module_files(root: Path, name: str) -> list[Path]:
    """The source file of module ``name`` ("lib.data") under ``root``: a module's .py or a package's __init__.py."""
    module = root / Path(*name.split("."))
    return [f for f in (module.with_suffix(".py"), module / "__init__.py") if f.is_file()]


def training_code(task: str) -> list[Path]:
    """The lib files training runs: this module, what it imports at the top of the file, and so on down,
    and the task's own module (loaded by name). A change to any other file (the report's plots, the
    decoders) leaves a checkpoint resumable; dvc.yaml lists the same files as the train stage's deps."""
    lib = Path(__file__).parent
    todo, found = [Path(__file__), lib / "tasks" / f"{task}.py"], set()
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.add(path)
        for node in ast.parse(path.read_text()).body:  # top-level imports only: lazy ones sit in functions
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in (n for n in names if n.split(".")[0] == "lib"):
                todo += module_files(lib.parent, name)
    return sorted(found)


def is_number(text: str) -> bool:
    """``text`` reads as a float, or is empty: how pandas writes a NaN back ("nan" and "inf" read too)."""
    try:
        float(text or "nan")
    except ValueError:
        return False
    return True


def truncate_curves(live_dir: str | Path, step: int):
    """Drop metric rows logged after ``step``: a killed run logged past its last checkpoint. A last line
    without its end is a write cut short (a full disk): dropped too, rather than read as a row ("20" of
    "201\t2.36" is step 20, its value missing). So, with a warning, are a row that is not a step and numbers and
    dvclive's summary, metrics.json, when it is not a JSON object: dvclive rewrites that file in place at every
    validation, so a full disk or a kill mid-write empties it, and resuming, which reads it, stopped on it at
    every re-run. The next validation writes it again."""
    summary = Path(live_dir) / "metrics.json"
    try:
        readable = not summary.is_file() or isinstance(json.loads(summary.read_text(encoding="utf-8")), dict)
    except ValueError:  # not JSON, or not UTF-8
        readable = False
    if not readable:
        log.warning("%s: not a JSON object; dropped (the next validation writes it again)", summary)
        summary.unlink()
    for tsv in (Path(live_dir) / "plots" / "metrics").rglob("*.tsv"):
        text = tsv.read_text(encoding="utf-8", errors="replace")  # a byte that is no UTF-8: its row is dropped
        finished = text[:text.rfind("\n") + 1]
        if not finished:  # not even the header: dvclive writes it again with the next row
            tsv.unlink()
            continue
        header, *lines = finished[:-1].split("\n")
        columns = header.rstrip("\r").split("\t")  # step and the value; a timestamp first, when one is logged
        bad = {number for number, line in enumerate(lines, 2)  # the header is line 1
               if len(fields := line.rstrip("\r").split("\t")) != len(columns)
               or not fields[columns.index("step")].isdigit() or not all(map(is_number, fields))}
        if bad:
            log.warning("%s: dropped line%s %s: not a step and numbers", tsv, "s" * (len(bad) > 1),
                        first_few(map(str, sorted(bad))))
        rows = [line for number, line in enumerate(lines, 2) if number not in bad]
        frame = pd.read_csv(io.StringIO("\n".join([header, *rows, ""])), sep="\t")
        with checkpoint.atomic_path(tsv) as tmp:
            frame[frame["step"] <= step].to_csv(tmp, sep="\t", index=False)


class DivergedError(ValueError):
    """The loss became NaN or infinite; the message names the step and the likely cause."""


def peak_tflops(given: float | str, precision: str, device: torch.device) -> float:
    """train.peak_tflops as a number: as given, or measured now, in ``precision``, when it is "measure"."""
    if given != "measure":
        return given
    peak = matmul_peak(PRECISION_DTYPES[precision], device, repeats=3) / 1e12
    log.info("train.peak_tflops: measured %.3f TFLOP/s (square %s matmuls on %s)", peak, precision, device)
    return peak


class Session:
    """What both loops share: the model, its optimizer, resumable state, the logger.

    ``state`` holds plain counters (step, best validation loss, and whatever
    the loop adds); ``generators`` the torch generators whose state a resume
    must restore. A checkpoint is resumed only when it shares this run's
    identity: every param but the length of training, the stop rules and
    ``RUN_KEYS``, and a fingerprint of the data, the tokenizer and the code
    training runs (``training_code``), so that a run after any change that
    DVC reruns training for starts afresh instead of resuming a stale model.
    Raising the length (epochs, max_iters) continues training, unless the
    learning-rate schedule is a function of it (an LM's cosine decay): the
    continued run would climb back up the new curve from the middle and end
    elsewhere than a straight run of that length, so it starts afresh.
    """

    def __init__(self, task, cfg, length: tuple[str, str], data_dir, tokenizer_dir, checkpoint_dir, live_dir,
                 make_optimizer, state: dict, generators: dict, stop_keys: tuple[str, ...] = (),
                 schedule_uses_length: bool = False):
        """``length``: the param that sets how long to train and the state counter it bounds;
        ``stop_keys``: other params that only decide when to stop (changing them continues the run);
        ``schedule_uses_length``: the learning rate depends on the length, so changing it starts afresh."""
        length_key, self.progress_key = length
        self.kind = get_task(task).KIND
        self.device = distributed.local_device(distributed.device_named(cfg.device, "train.device"))
        self.ctx = distributed.setup(self.device)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.tokenizers = load_tokenizers(tokenizer_dir)
        self.ids = special_ids(self.tokenizers)
        self.vocab = {"src_vocab_size": self.tokenizers.source.get_vocab_size(),
                      "tgt_vocab_size": self.tokenizers.target.get_vocab_size(),
                      "joint_vocab": self.tokenizers.joint}
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, self.kind, **self.vocab)  # the same weights in every process
        distributed.seed_own_stream(cfg.seed, self.ctx)  # but dropout masks of its own
        self.model.to(self.device)
        *parts, (_, total) = parameter_counts(self.model).items()
        log.info("model: %s parameters (%s)", f"{total:,}", ", ".join(f"{part} {n:,}" for part, n in parts))
        # What the model file records of how it was trained, beside its step and validation loss: the task
        # (so that another task's stages refuse it), and for the report the label smoothing (the least loss it
        # lets the training loss reach) and how often the untrained model predicted the token it was given (a
        # cause of a first loss far above ln V).
        self.trained_with = {"task": task, "initial_repeats_input": round(repeats_input(self.model, self.ids), 4)}
        if hasattr(cfg, "label_smoothing"):
            self.trained_with["label_smoothing"] = cfg.label_smoothing
        self.train_model = distributed.wrap(self.model, self.ctx, self.device)  # forward and backward go here
        if cfg.compile:
            log.info("train.compile: the first step compiles the model (a minute or two on a GPU)")
            self.train_model = compile_model(self.train_model, self.kind)
        self.optimizer = make_optimizer(self.model)
        self.state = {"step": 0, "best_valid_loss": math.inf, **state}
        self.generators = generators
        self.checkpoint_dir = Path(checkpoint_dir)
        self.last_path, self.best_path = self.checkpoint_dir / "last.pt", self.checkpoint_dir / "best.pt"
        config = {k: v for k, v in asdict(cfg).items()
                  if (k != length_key or schedule_uses_length) and k not in stop_keys and k not in RUN_KEYS}
        self.identity = {"config": config,
                         "inputs": fingerprint([Path(data_dir), Path(tokenizer_dir), *training_code(task)])}
        self.precision = resolve_precision(cfg.precision, self.device)
        self.peak_tflops = peak_tflops(cfg.peak_tflops, self.precision, self.device)
        self.live_dir = live_dir
        self.resumed = self._resume(getattr(cfg, length_key))
        self.live = None

    def open(self):
        """Start writing: clear the outputs of an earlier run, or when resuming it, drop the curves' rows
        logged after its checkpoint.

        Called after the loop has checked its data, so that a bad input
        leaves the previous checkpoints and curves as they were. Under torchrun
        only rank 0 writes, once every process has read what it resumes from.
        """
        distributed.barrier(self.ctx)
        if not self.ctx.is_main:
            return
        if self.resumed:
            truncate_curves(self.live_dir, self.state["step"])
            for stale in self.checkpoint_dir.glob(".*.tmp"):  # a save that kill -9 cut short
                stale.unlink()
        else:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
            shutil.rmtree(self.live_dir, ignore_errors=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.live = Live(dir=str(self.live_dir), resume=self.resumed, report=None, save_dvc_exp=False,
                         dvcyaml=False)

    def _resume(self, length: int) -> bool:
        if not self.last_path.is_file():
            return False
        # Training would stop on it again at every re-run: the way out is to start afresh.
        # Onto the CPU: a generator takes its state only from there, and load_state_dict copies the weights
        # and the optimizer's state onto the model's device.
        saved = checkpoint.load(self.last_path, remedy=f"delete {self.checkpoint_dir} to train from the start")
        reason = self._mismatch(saved, length)
        if reason:
            log.info("%s: %s; starting afresh", self.last_path, reason)
            return False
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        distributed.restore_random_state(saved["rng"], self.ctx)
        for name, generator in self.generators.items():
            generator.set_state(saved["generators"][name])
        self.state = {k: saved[k] for k in self.state}
        if self.state["best_valid_loss"] < math.inf:  # it has validated, so finish will copy best.pt
            self._check_best()
        log.info("resuming from %s at step %d", self.last_path, self.state["step"])
        return True

    def _check_best(self):
        """best.pt, which ``finish`` copies into model.pt as it is, there and whole: found before a resumed run
        trains, not as an unreadable model.pt after it (copied again by every re-run, so that "re-run the train
        stage" could not mend it) or a missing file at the end."""
        remedy = f"delete {self.checkpoint_dir} to train from the start"
        if not self.best_path.is_file():
            raise ValueError(f"{self.best_path}: not found, though {self.last_path} has validated; {remedy}")
        checkpoint.load(self.best_path, remedy=remedy)

    def _mismatch(self, saved: dict, length: int) -> str | None:
        """Why a saved checkpoint cannot be resumed, naming the first differing param; None if it can."""
        old = flatten(saved.get("config", {}))
        for key, value in flatten(self.identity["config"]).items():
            if old.get(key) != value:
                return f"train.{key} changed ({old.get(key)!r} -> {value!r})"
        if saved.get("inputs") != self.identity["inputs"]:
            return "the data, the tokenizer or the code changed"
        if saved[self.progress_key] > length:
            return f"it trained past the requested length ({saved[self.progress_key]} > {length})"
        return None

    def save_last(self):
        rng = distributed.random_states(self.ctx)  # every process's, gathered: they all take part
        if not self.ctx.is_main:
            return
        checkpoint.save(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
             "rng": rng, "generators": {k: g.get_state() for k, g in self.generators.items()},
             **self.state, **self.identity},
            self.last_path,
        )

    def update(self, loss_sum: torch.Tensor, divisor: float, clip_norm: float, clock):
        """A step's end, its batches' gradients in: the loss summed over the processes and divided by
        ``divisor`` (the step's mean), the gradients clipped to ``clip_norm``, both read back (the step's one
        wait, timed by ``clock``), then the optimizer's update, unless the loss is NaN or infinite: that stops
        training before the update spreads it into the weights.
        Returns (the mean loss, the gradients' norm before clipping, the step's seconds)."""
        loss = distributed.sum_over_processes(loss_sum, self.ctx) / divisor
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip_norm, foreach=True)
        loss, grad_norm = read_back(loss, grad_norm)
        seconds = clock.lap()
        if not math.isfinite(loss):
            kept = f"the last good checkpoint, {self.last_path}, is kept" if self.last_path.is_file() else \
                "no checkpoint was written yet"
            raise DivergedError(
                f"training diverged at step {self.state['step']}: the loss is {loss}. The likely cause is "
                f"a learning rate too high for this model ({LR_PARAM[self.kind]}, train.warmup); {kept}"
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm, seconds

    def log(self, **metrics):
        if not self.ctx.is_main:
            return
        self.live.step = self.state["step"]
        with checkpoint.naming(self.live_dir):  # dvclive writes a curve's line each time
            for name, value in metrics.items():
                self.live.log_metric(name, value)

    def record_validation(self, valid_loss: float, extra: dict):
        """Log the validation loss; keep the weights when they are the best so far."""
        self.log(**{"valid/loss": valid_loss, "valid/perplexity": perplexity(valid_loss)})
        if self.ctx.is_main:
            with checkpoint.naming(self.live_dir):
                self.live.make_summary()
        if valid_loss < self.state["best_valid_loss"]:
            self.state["best_valid_loss"] = valid_loss
            self.save_model({"step": self.state["step"], "valid_loss": valid_loss, **extra}, self.best_path)
            return True
        return False

    def save_model(self, extra: dict, path):
        if self.ctx.is_main:
            checkpoint.save_model(self.model, self.kind, self.vocab, {**extra, **self.trained_with}, path)

    def autocast(self):
        """The forward pass's precision: bf16 autocast, or nothing changed."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def finish(self, model_path, source=None) -> dict:
        """Write ``source`` (default: the best checkpoint) to ``model_path``; under torchrun, every process
        then leaves the process group."""
        if self.ctx.is_main:
            with checkpoint.naming(self.live_dir):
                self.live.end()
            with checkpoint.atomic_path(model_path) as tmp:
                shutil.copyfile(source or self.best_path, tmp)
        distributed.barrier(self.ctx)
        distributed.leave(self.ctx)
        return {"step": self.state["step"], "best_valid_loss": self.state["best_valid_loss"],
                "resumed": self.resumed}


def read_back(*scalars: torch.Tensor) -> list[float]:
    """A step's loss and gradient norm on the host: its one wait for the device.

    Read once the backward pass and the clipping are queued, before the optimizer
    step (so that a NaN is caught before it reaches the weights): on a GPU the
    host then waits only for work it has already queued, and the device is never
    left idle mid-step. The optimizer's kernels run while the host logs and
    prepares the next batch; the next step's wait includes them.
    """
    return [value.item() for value in scalars]


class StepClock:
    """Each step's wall time, from the previous step's read-back to its own.

    On a GPU a step's last kernels (the optimizer's) run after the host has moved
    on, so the clock ticks at the one wait a step has: the steps' times then add
    up to the time spent training, logging and collating included, and
    tokens/s and MFU are what a user gets. ``pause`` before anything else
    (validation, a checkpoint): the next step then counts from its own start.
    """

    def __init__(self):
        self.mark = None

    def start(self):
        if self.mark is None:
            self.mark = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.mark = now - self.mark, now
        return seconds

    def pause(self):
        self.mark = None


def set_lr(optimizer: torch.optim.Optimizer, lr: float):
    for group in optimizer.param_groups:
        group["lr"] = lr


# --- The encoder-decoder -----------------------------------------------------------------------

def seq2seq_loss(model, batch, ids: SpecialIds, smoothing: float, compiled: bool = False) -> tuple[torch.Tensor, int]:
    """Summed label-smoothed loss of a teacher-forced batch, and its target count.

    ``model`` may be wrapped in DistributedDataParallel: its forward runs through
    the wrapper, and the fused output layer and loss use the inner model's generator.
    ``compiled`` (train.compile, with the model compiled): the loss's blocks compiled too.
    """
    hidden = model(batch.src, batch.tgt_in, padding_mask(batch.src, ids.pad), target_mask(batch.tgt_in, ids.pad),
                   project=False)  # (B, T, C)
    generator = getattr(model, "module", model).generator
    return generator_nll(hidden, generator, batch.tgt_out, ids.pad, smoothing, count=batch.n_tokens, compiled=compiled)


@torch.no_grad()
def mean_loss(model, pairs: Pairs, ids: SpecialIds, max_tokens: int, device) -> float:
    """Per-token cross-entropy (no smoothing) over a whole split, in eval mode."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for indices in token_budget_batches(pairs, max_tokens):
        loss, n = seq2seq_loss(model, collate(pairs, indices, ids).to(device), ids, 0.0)
        total, count = total + loss.item(), count + n
    model.train(was_training)
    return total / count


def fit_lengths(pairs: Pairs, max_len: int, split: str, too_long: str) -> Pairs:
    """Every sequence (with its bos or eos) must fit the positional encoding: fail, or skip the pairs that do not."""
    widths = pairs.widths()  # the positions each pair takes: its source, or its target with its bos or eos
    fits = [width <= max_len for width in widths]
    if all(fits):
        return pairs
    if too_long == "fail":
        raise ConfigError(f"train.model.max_len: {max_len} is shorter than the longest {split} sequence "
                          f"({max(widths)} tokens); raise it, or set train.too_long: skip")
    kept = [i for i, ok in enumerate(fits) if ok]
    log.warning("%s: skipped %d of %d pairs longer than train.model.max_len %d (train.too_long: skip)", split,
                len(pairs) - len(kept), len(pairs), max_len)
    if not kept:
        raise ConfigError(f"train.model.max_len: {max_len} is shorter than every {split} pair")
    return Pairs([pairs.src[i] for i in kept], [pairs.tgt[i] for i in kept])


def evaluated_splits(task: str) -> tuple[str, ...]:
    """The splits the evaluate stage decodes and scores: test, and the task's EXTRA_SPLIT (cumsum's length study)."""
    module = get_task(task)
    return ("test", *([module.EXTRA_SPLIT] if hasattr(module, "EXTRA_SPLIT") else []))


def check_evaluated_lengths(task: str, splits: dict[str, Pairs], max_len: int):
    """``splits`` (``evaluated_splits``, encoded) must fit ``max_len`` whatever train.too_long says, for evaluate has
    no pair it may drop: a ConfigError naming the longest, before training (the evaluate stage had failed on it
    after training, with the model's own "sequence length 35 exceeds model.max_len 32 in params.yaml")."""
    for split, pairs in splits.items():
        if (longest := max(pairs.widths())) > max_len:
            sets = getattr(get_task(task), "EXTRA_SPLIT_LONGEST", None) if split != "test" else None
            raise ConfigError(f"train.model.max_len: {max_len} is shorter than the longest {split} sequence ({longest} "
                              "tokens), which the evaluate stage decodes and scores; raise it"
                              + (f", or lower {task}.{sets}" if sets else "")
                              + " (train.too_long: skip drops training pairs only)")


def check_budget(pairs: Pairs, max_tokens: int):
    """Warn when pairs are wider than the token budget: each of them is a batch of its own (token_budget_batches),
    one sentence a batch, and a budget meant in sentences (max_tokens: 8) makes every batch that."""
    over = [width for width in pairs.widths() if width > max_tokens]
    if over:
        log.warning("train.max_tokens %d: %s of %s train pairs are wider (up to %d tokens a side), and each of them "
                    "is a batch of one sentence; raise it to batch them", max_tokens, f"{len(over):,}",
                    f"{len(pairs):,}", max(over))


def average_weights(paths: list[Path]) -> dict:
    """The element-wise mean of several saved models' weights (checkpoint averaging)."""
    states = [checkpoint.load(path, remedy=f"delete {path.parent} to train from the start")["model"]
              for path in paths]
    return {name: sum(state[name].double() for state in states).div(len(states)).to(states[0][name].dtype)
            for name in states[0]}


def stop_reason(cfg: TrainConfig, state: dict) -> str | None:
    """Why training stops before its next epoch, or None to go on."""
    if state["epoch"] >= cfg.epochs:
        return f"trained {cfg.epochs} epoch{'s' * (cfg.epochs != 1)} (train.epochs)"
    if cfg.time_budget_minutes and state["elapsed_s"] >= 60 * cfg.time_budget_minutes:
        return f"spent {state['elapsed_s'] / 60:.1f} minutes (train.time_budget_minutes: {cfg.time_budget_minutes})"
    if cfg.patience and state["epochs_since_best"] >= cfg.patience:
        return f"no better validation loss for {cfg.patience} epochs (train.patience)"
    return None


def train_seq2seq(task, cfg: TrainConfig, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir) -> dict:
    """Epochs of token-budget batches until ``stop_reason``; model.pt the best (or averaged) weights."""
    def adam(model):  # fused: one pass over each parameter, half the time of the foreach kernels on a CPU
        return torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True)

    run = Session(task, cfg, ("epochs", "epoch"), data_dir, tokenizer_dir, checkpoint_dir, live_dir, adam,
                  {"epoch": 0, "batches_done": 0, "elapsed_s": 0.0, "epochs_since_best": 0}, {},
                  stop_keys=("time_budget_minutes", "patience", "average_last"))
    model, optimizer, state, ids, device = run.model, run.optimizer, run.state, run.ids, run.device
    train = encode_pairs(run.tokenizers, read_split(data_dir, "train"))
    valid = encode_pairs(run.tokenizers, read_split(data_dir, "valid"))
    train = fit_lengths(train, cfg.model.max_len, "train", cfg.too_long)
    valid = fit_lengths(valid, cfg.model.max_len, "valid", cfg.too_long)
    check_evaluated_lengths(task, {split: encode_pairs(run.tokenizers, read_split(data_dir, split))
                                   for split in evaluated_splits(task)}, cfg.model.max_len)
    check_budget(train, cfg.max_tokens)
    run.open()

    def load(indices: list[int]):  # this process's part of a global batch, on its way to the device
        rows, weight = distributed.shard(indices, run.ctx)
        return collate(train, rows, ids).to(device), weight

    model.train()
    clock = StepClock()
    while (reason := stop_reason(cfg, state)) is None:
        epoch, started = state["epoch"], time.perf_counter()
        order = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
        batches = token_budget_batches(train, cfg.max_tokens, order)
        todo = batches[state["batches_done"]:]  # resuming mid-epoch: checkpoints fall between steps' groups
        steps = [todo[i:i + cfg.accumulate] for i in range(0, len(todo), cfg.accumulate)]  # each step's batches
        # A with: an error or Ctrl-C clears the bar too, so that the stage's one-line message starts a line.
        with tqdm(desc=f"epoch {epoch + 1}/{cfg.epochs}", initial=state["batches_done"], total=len(batches),
                  leave=False, disable=not run.ctx.is_main) as progress:
            upcoming, loaded = (load(todo[0]), 1) if todo else (None, 0)
            for group in steps:
                clock.start()
                src_lengths = [len(train.src[row]) for indices in group for row in indices]  # the global batches'
                tgt_lengths = [len(train.tgt[row]) + 1 for indices in group for row in indices]  # targets, eos included
                n_tokens = sum(tgt_lengths)
                state["step"] += 1
                lr = noam_lr(state["step"], cfg.model.d_model, cfg.warmup, cfg.lr_factor)
                set_lr(optimizer, lr)
                loss_sum = torch.zeros((), device=device)
                for j in range(len(group)):
                    batch, weight = upcoming
                    with distributed.accumulating(run.train_model, last=j + 1 == len(group)):
                        with run.autocast():
                            batch_loss, _ = seq2seq_loss(run.train_model, batch, ids, cfg.label_smoothing,
                                                         compiled=cfg.compile)
                        # The update is the mean over the step's target tokens, in every process and batch: DDP
                        # averages the gradients over the processes, hence the factor.
                        (batch_loss / n_tokens * (weight * run.ctx.world)).backward()
                    loss_sum += batch_loss.detach() * weight
                    if loaded < len(todo):  # the host collates the next batch while the device computes this one
                        upcoming, loaded = load(todo[loaded]), loaded + 1
                global_loss, grad_norm, seconds = run.update(loss_sum, n_tokens, cfg.clip_norm, clock)
                flops = training_flops(cfg.model, run.vocab["tgt_vocab_size"], src_lengths, tgt_lengths)
                run.log(**{"train/loss": global_loss, "train/lr": lr, "train/grad_norm": grad_norm,
                           **speed(n_tokens + sum(src_lengths), flops, seconds, run.peak_tflops)})
                progress.update(len(group))
                progress.set_postfix(loss=f"{global_loss:.3f}", lr=f"{lr:.2e}")
                state["batches_done"] += len(group)
                if state["step"] % cfg.checkpoint_every == 0:
                    state["elapsed_s"] += time.perf_counter() - started
                    started = time.perf_counter()
                    run.save_last()
                    clock.pause()

        clock.pause()
        valid_loss = mean_loss(model, valid, ids, cfg.max_tokens, device)
        log.info("epoch %d: valid loss %.4f", epoch + 1, valid_loss)
        run.log(epoch=epoch + 1)
        improved = run.record_validation(valid_loss, {})
        run.save_model({"step": state["step"], "valid_loss": valid_loss}, run.checkpoint_dir / f"epoch-{epoch + 1}.pt")
        if run.ctx.is_main:
            (run.checkpoint_dir / f"epoch-{epoch + 1 - cfg.average_last}.pt").unlink(missing_ok=True)
        elapsed = distributed.from_main(state["elapsed_s"] + time.perf_counter() - started, run.ctx)
        state.update(epoch=epoch + 1, batches_done=0, elapsed_s=elapsed,
                     epochs_since_best=0 if improved else state["epochs_since_best"] + 1)
        run.save_last()
    log.info("stopped: %s", reason)
    return run.finish(model_path, averaged_model(run, cfg, valid))


def averaged_model(run: Session, cfg: TrainConfig, valid: Pairs) -> Path | None:
    """The average of the last ``average_last`` epochs' weights, when it validates better than the best.

    Rank 0 alone decides: it wrote the epochs' weights, and it alone writes model.pt.
    """
    if not run.ctx.is_main:
        return None
    last = [run.checkpoint_dir / f"epoch-{e}.pt" for e in range(run.state["epoch"], 0, -1)][:cfg.average_last]
    last = [path for path in last if path.is_file()]
    if len(last) < 2:
        return None
    run.model.load_state_dict(average_weights(last))
    valid_loss = mean_loss(run.model, valid, run.ids, cfg.max_tokens, run.device)
    log.info("average of the last %d epochs: valid loss %.4f (best single epoch %.4f)", len(last), valid_loss,
             run.state["best_valid_loss"])
    run.log(**{"valid/averaged_loss": valid_loss})
    if valid_loss >= run.state["best_valid_loss"]:
        return None
    path = run.checkpoint_dir / "averaged.pt"
    run.save_model({"step": run.state["step"], "valid_loss": valid_loss, "averaged_epochs": len(last)}, path)
    return path


# --- The decoder-only language model -------------------------------------------------------------

def random_blocks(ids: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator):
    """B random contiguous blocks: inputs (B, T) and targets, the same shifted by one (B, T)."""
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)  # (B,)
    window = starts[:, None] + torch.arange(block_size + 1)  # (B, T + 1)
    tokens = ids[window]  # (B, T + 1)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (no smoothing: it is a likelihood we report)."""
    logits = model(x)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


@torch.no_grad()
def estimate_loss(model, batches: list[tuple[torch.Tensor, torch.Tensor]], device) -> float:
    was_training = model.training
    model.eval()
    losses = [lm_loss(model, x.to(device), y.to(device)).item() for x, y in batches]
    model.train(was_training)
    return sum(losses) / len(losses)


def lm_lr(step: int, cfg: LMTrainConfig) -> float:
    if cfg.schedule == "cosine":
        return cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.max_iters)
    # Noam with its factor chosen so that the peak, at step == warmup, is cfg.lr.
    factor = cfg.lr * cfg.model.d_model**0.5 * cfg.warmup**0.5
    return noam_lr(step, cfg.model.d_model, cfg.warmup, factor)


def train_lm(task, cfg: LMTrainConfig, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir) -> dict:
    def adamw(model):
        groups = weight_decay_groups(model, cfg.weight_decay)
        return torch.optim.AdamW(groups, lr=0.0, betas=(0.9, cfg.beta2), fused=True)

    sampler = torch.Generator().manual_seed(cfg.seed)
    run = Session(task, cfg, ("max_iters", "step"), data_dir, tokenizer_dir, checkpoint_dir, live_dir, adamw, {},
                  {"sampler": sampler}, schedule_uses_length=cfg.schedule == "cosine")
    model, optimizer, state, device = run.model, run.optimizer, run.state, run.device
    train = encode_text(run.tokenizers.target, read_text(data_dir, "train"))
    valid = encode_text(run.tokenizers.target, read_text(data_dir, "valid"))
    for split, ids in (("train", train), ("valid", valid)):
        if len(ids) <= cfg.block_size:
            raise ConfigError(f"train.block_size: {cfg.block_size} is not shorter than the {split} split "
                              f"({len(ids)} tokens)")
    # The same batches at every estimate, so that the curves move only with the model.
    fixed = torch.Generator().manual_seed(cfg.seed + 1)
    eval_sets = {name: [random_blocks(ids, cfg.batch_size, cfg.block_size, fixed) for _ in range(cfg.eval_batches)]
                 for name, ids in (("train", train), ("valid", valid))}
    if cfg.batch_size % run.ctx.world:
        raise ConfigError(f"train.batch_size: {cfg.batch_size} does not divide among {run.ctx.world} processes")
    blocks = cfg.batch_size * cfg.accumulate  # every step's, and its tokens and FLOPs
    tokens = blocks * cfg.block_size
    flops = training_flops(cfg.model, run.vocab["tgt_vocab_size"], [], [cfg.block_size] * blocks)
    run.open()

    model.train()
    clock = StepClock()
    with tqdm(range(state["step"], cfg.max_iters), initial=state["step"], total=cfg.max_iters, leave=False,
              disable=not run.ctx.is_main) as progress:  # cleared on an error too, as in seq2seq
        for _ in progress:
            clock.start()
            state["step"] += 1
            step = state["step"]
            lr = lm_lr(step, cfg)
            set_lr(optimizer, lr)
            loss_sum = torch.zeros((), device=device)
            for j in range(cfg.accumulate):
                x, y = random_blocks(train, cfg.batch_size, cfg.block_size, sampler)  # a global batch
                x, y = x[run.ctx.rank::run.ctx.world], y[run.ctx.rank::run.ctx.world]  # this process's rows
                with distributed.accumulating(run.train_model, last=j + 1 == cfg.accumulate):
                    with run.autocast():
                        loss = lm_loss(run.train_model, to_device(x, device), to_device(y, device))
                    (loss / cfg.accumulate).backward()  # equal batches: the step's mean is the mean of their means
                loss_sum += loss.detach()
            global_loss, grad_norm, seconds = run.update(loss_sum, run.ctx.world * cfg.accumulate, cfg.clip_norm, clock)
            run.log(**{"train/loss": global_loss, "train/lr": lr, "train/grad_norm": grad_norm,
                       **speed(tokens, flops, seconds, run.peak_tflops)})
            progress.set_postfix(loss=f"{global_loss:.3f}", lr=f"{lr:.2e}")
            if step % cfg.eval_every == 0 or step == cfg.max_iters:
                train_loss = estimate_loss(model, eval_sets["train"], device)
                valid_loss = estimate_loss(model, eval_sets["valid"], device)
                log.info("step %d: train loss %.4f, valid loss %.4f", step, train_loss, valid_loss)
                run.log(**{"eval/train_loss": train_loss})
                run.record_validation(valid_loss, {"block_size": cfg.block_size})
                clock.pause()
            if step % cfg.checkpoint_every == 0 or step == cfg.max_iters:
                run.save_last()
                clock.pause()
    return run.finish(model_path)


class OutOfMemory(ValueError):
    """The device's memory ran out (a GPU's torch.OutOfMemoryError, or the CPU allocator's refusal): the message
    names the params that size a step, and how to keep the update while halving them."""


def _out_of_memory(err: RuntimeError) -> str | None:
    """What ran out and how much was asked ("CUDA out of memory. Tried to allocate 2.00 GiB"), if ``err`` says
    memory ran out: a GPU's torch.OutOfMemoryError, or the CPU allocator's RuntimeError ("DefaultCPUAllocator:
    can't allocate memory: you tried to allocate 80000000000 bytes"); None for any other error."""
    if isinstance(err, torch.OutOfMemoryError):
        return ". ".join(str(err).split(". ")[:2])  # then torch's advice on its allocator's settings
    asked = re.search(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes", str(err))
    return asked and f"CPU out of memory. Tried to allocate {int(asked[1]) / 2 ** 30:.2f} GiB"


def run(task, cfg, data_dir, tokenizer_path, model_path, checkpoint_dir, live_dir) -> dict:
    """The train stage: the loop that fits the task's kind."""
    lm = get_task(task).KIND == "lm"
    loop = train_lm if lm else train_seq2seq
    try:
        return loop(task, cfg, data_dir, tokenizer_path, model_path, checkpoint_dir, live_dir)
    except RuntimeError as err:  # torch.OutOfMemoryError is one
        said = _out_of_memory(err)
        if not said:
            raise
        batch = (f"train.batch_size {cfg.batch_size} blocks of train.block_size {cfg.block_size} tokens; halve "
                 "batch_size" if lm else f"train.max_tokens {cfg.max_tokens} padded tokens a side; halve it")
        raise OutOfMemory(f"{said}: a batch is {batch} and double train.accumulate (now {cfg.accumulate}): an "
                          "update sees as many tokens, in half the memory; or make train.model smaller") from None
