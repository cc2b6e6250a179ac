"""The training loops (sec. 5 of the paper; nanoGPT's recipe for the LM), each read top to bottom.

The encoder-decoder trains by epochs over token-budget batches with Adam, Noam warmup and label smoothing;
the decoder-only LM by iterations over random contiguous blocks with AdamW and a cosine or Noam schedule.
Every step: set the learning rate, forward, loss, backward, clip, step, zero the gradients, log. Set-up
(lib.model.setup) and bookkeeping (lib.train.run: resume, checkpoints, model.pt) live beside them.
Dims: B batch, T block length, V vocabulary.
"""

import contextlib
import logging
import os
import time
from pathlib import Path

import torch
from tqdm import tqdm

from lib.model import checkpoint
from lib.core import distributed, signals
from lib.core.config import ConfigError, LMTrainConfig, TrainConfig
from lib.data.pairs import Pairs, collate, read_split, read_text, to_device, token_budget_batches
from lib.model.translate import greedy_translate
from lib.model.device import out_of_memory, out_of_memory_error
from lib.core.files import held_alone
from lib.model.lengths import check_budget, check_evaluated_lengths, fit_lengths
from lib.model.losses import estimate_loss, lm_loss, mean_loss, seq2seq_loss
from lib.model.metrics import speed, training_flops
from lib.train.run import Run
from lib.model.setup import set_up
from lib.tasks import evaluated_splits, get_task
from lib.data.token_store import MappedPairs, meta_path
from lib.data.tokenizer import decode, encode_pairs, encode_text
from transformer.schedules import cosine_lr, noam_lr

log = logging.getLogger(__name__)


def set_lr(optimizer: torch.optim.Optimizer, lr: float):
    for group in optimizer.param_groups:
        group["lr"] = lr


def read_back(*scalars: torch.Tensor) -> list[float]:
    """A step's loss and gradient norm on the host: its one wait for the device, once backward and clipping
    are queued and before the optimizer's step (so that a NaN never reaches the weights)."""
    return [value.item() for value in scalars]


class StepClock:
    """Each step's wall time, from the previous step's read-back to its own, so that the steps' times add up
    to the time spent training (logging and collating included). ``pause`` before anything else (validation,
    a checkpoint): the next step then counts from its own start."""

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


# --- The encoder-decoder -----------------------------------------------------------------------

def stop_reason(cfg: TrainConfig, state: dict) -> str | None:
    """Why training stops before its next epoch, or None to go on."""
    if state["epoch"] >= cfg.epochs:
        return f"trained {cfg.epochs} epoch{'s' * (cfg.epochs != 1)} (train.epochs)"
    if cfg.max_steps and state["step"] >= cfg.max_steps:
        return f"trained {cfg.max_steps} steps (train.max_steps)"
    if cfg.time_budget_minutes and state["elapsed_s"] >= 60 * cfg.time_budget_minutes:
        return f"spent {state['elapsed_s'] / 60:.1f} minutes (train.time_budget_minutes: {cfg.time_budget_minutes})"
    if cfg.patience and state["epochs_since_best"] >= cfg.patience:
        return f"no better validation loss for {cfg.patience} epochs (train.patience)"
    return None


def encoded_split(tokenizers, data_dir, tokenizer_dir, split: str) -> Pairs:
    """A split's pairs as token ids: memory-mapped where the tokenize stage wrote them (a corpus of millions,
    ``TOKEN_STORE``), else encoded here."""
    if meta_path(tokenizer_dir, split).is_file():
        return MappedPairs(tokenizer_dir, split)
    return encode_pairs(tokenizers, read_split(data_dir, split))


def seq2seq_splits(run: Run, cfg: TrainConfig, data_dir, tokenizer_dir) -> tuple[Pairs, Pairs]:
    """The train and valid pairs, encoded; every split evaluate decodes checked to fit first."""
    task, tokenizers = run.trainee.task, run.trainee.tokenizers
    train, valid = (fit_lengths(encoded_split(tokenizers, data_dir, tokenizer_dir, split), cfg.model.max_len, split,
                                cfg.too_long) for split in ("train", "valid"))
    check_evaluated_lengths(task, {split: encode_pairs(tokenizers, read_split(data_dir, split))
                                   for split in evaluated_splits(task)}, cfg.model.max_len)
    check_budget(train, cfg.max_tokens)
    return train, valid


def train_seq2seq(task, cfg: TrainConfig, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir) -> dict:
    """Epochs of token-budget batches until ``stop_reason``; model.pt the best (or averaged) weights."""
    trainee = set_up(task, cfg, tokenizer_dir)
    # fused: one pass over each parameter, where the foreach kernels take two on a CPU
    optimizer = torch.optim.Adam(trainee.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True)
    run = Run(trainee, cfg, optimizer, ("epochs", "epoch"),
              {"epoch": 0, "batches_done": 0, "elapsed_s": 0.0, "epochs_since_best": 0}, {}, data_dir,
              tokenizer_dir, checkpoint_dir, live_dir,
              stop_keys=("max_steps", "time_budget_minutes", "patience", "average_last"))
    train, valid = seq2seq_splits(run, cfg, data_dir, tokenizer_dir)
    run.open()
    trainee.model.train()
    clock = StepClock()
    with signals.held_to_step_ends(run.ctx.world == 1):
        while (reason := stop_reason(cfg, run.state)) is None:
            started = time.perf_counter()
            started, complete = seq2seq_epoch(run, cfg, train, clock, started)
            clock.pause()
            end_epoch(run, cfg, valid, started, complete)
    log.info("stopped: %s", reason)
    return run.finish(model_path, averaged_model(run, cfg, valid))


def seq2seq_epoch(run: Run, cfg: TrainConfig, train: Pairs, clock: StepClock, started: float) -> tuple[float, bool]:
    """The rest of the epoch's steps (all of them, unless resuming mid-epoch, or up to ``max_steps``); returns
    when its time last restarted counting (at each checkpoint, which adds the time so far to the state) and
    whether the epoch is complete."""
    trainee, optimizer, state = run.trainee, run.optimizer, run.state
    model, ids, device, ctx = trainee.train_model, trainee.ids, trainee.device, trainee.ctx
    epoch = state["epoch"]
    order = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
    batches = token_budget_batches(train, cfg.max_tokens, order)
    todo = batches[state["batches_done"]:]  # resuming mid-epoch: checkpoints fall between steps' groups
    steps = [todo[i:i + cfg.accumulate] for i in range(0, len(todo), cfg.accumulate)]  # each step's batches

    def load(indices: list[int]):  # this process's part of a global batch, on its way to the device
        rows, weight = distributed.shard(indices, ctx)
        return collate(train, rows, ids).to(device), weight

    # A with: an error or Ctrl-C clears the bar too, so that the stage's one-line message starts a line.
    with tqdm(desc=f"epoch {epoch + 1}/{cfg.epochs}", initial=state["batches_done"], total=len(batches),
              leave=False, disable=None if ctx.is_main else True) as progress:  # None: at a terminal only
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
                with distributed.accumulating(model, last=j + 1 == len(group)):
                    with trainee.autocast():
                        batch_loss, _ = seq2seq_loss(model, batch, ids, cfg.label_smoothing, cfg.fast, cfg.compile)
                    # The update is the mean over the step's target tokens, in every process and batch: DDP
                    # averages the gradients over the processes, hence the factor.
                    (batch_loss / n_tokens * (weight * ctx.world)).backward()
                loss_sum += batch_loss.detach() * weight
                if loaded < len(todo):  # the host collates the next batch while the device computes this one
                    upcoming, loaded = load(todo[loaded]), loaded + 1
            loss = distributed.sum_over_processes(loss_sum, ctx) / n_tokens
            grad_norm = torch.nn.utils.clip_grad_norm_(trainee.model.parameters(), cfg.clip_norm, foreach=True)
            loss, grad_norm = read_back(loss, grad_norm)
            seconds = clock.lap()
            run.check_finite(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            flops = training_flops(cfg.model, trainee.vocab["tgt_vocab_size"], src_lengths, tgt_lengths)
            run.log(**{"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
                       **speed(n_tokens + sum(src_lengths), flops, seconds, trainee.peak_tflops)})
            progress.update(len(group))
            progress.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")
            state["batches_done"] += len(group)
            if cfg.average_every and state["step"] % cfg.average_every == 0:
                keep_for_averaging(run, cfg)
            if state["step"] % cfg.checkpoint_every == 0 or signals.stop_requested():
                state["elapsed_s"] += time.perf_counter() - started
                started = time.perf_counter()
                run.save_last()
                clock.pause()
                signals.stop_if_requested()
            if cfg.max_steps and state["step"] >= cfg.max_steps:
                break
    return started, state["batches_done"] == len(batches)


def end_epoch(run: Run, cfg: TrainConfig, valid: Pairs, started: float, complete: bool):
    """Validate, keep the epoch's weights for averaging, and checkpoint at the epoch's end. An epoch cut
    short by ``max_steps`` validates too but keeps its place: raising max_steps finishes it."""
    trainee, state = run.trainee, run.state
    epoch = state["epoch"]
    valid_loss = mean_loss(trainee.model, valid, trainee.ids, cfg.max_tokens, trainee.device, cfg.fast)
    score = validation_score(run, cfg, valid) if cfg.valid_score else {}
    log.info("epoch %d%s: valid loss %.4f%s", epoch + 1, "" if complete else f" (to step {state['step']})",
             valid_loss, "".join(f", {name.split('/')[1]} {value:.4f}" for name, value in score.items()))
    run.log(**({"epoch": epoch + 1} if complete else {}), **score)
    improved = run.record_validation(valid_loss, {})
    if complete:
        run.save_model({"step": state["step"], "valid_loss": valid_loss},
                       run.checkpoint_dir / f"epoch-{epoch + 1}.pt")
        if run.ctx.is_main:
            (run.checkpoint_dir / f"epoch-{epoch + 1 - cfg.average_last}.pt").unlink(missing_ok=True)
        state.update(epoch=epoch + 1, batches_done=0)
    elapsed = distributed.from_main(state["elapsed_s"] + time.perf_counter() - started, run.ctx)
    state.update(elapsed_s=elapsed, epochs_since_best=0 if improved else state["epochs_since_best"] + complete)
    run.save_last()


VALID_EXTRA_TOKENS = 50  # a valid output may run this many tokens past its source (and stops at max_len)


@torch.no_grad()
def validation_score(run: Run, cfg: TrainConfig, valid: Pairs) -> dict[str, float]:
    """The task's ``VALID_SCORE`` of the greedy outputs of the valid split, against its references as the
    tokenizer gives them back; on the main process, which alone logs."""
    trainee, module = run.trainee, get_task(run.trainee.task)
    name = getattr(module, "VALID_SCORE", None)
    if name is None or not run.ctx.is_main:
        return {}
    model, was_training = trainee.model, trainee.model.training
    model.eval()
    outputs = greedy_translate(model, valid.src, trainee.ids, cfg.max_tokens, VALID_EXTRA_TOKENS)
    model.train(was_training)
    target = trainee.tokenizers.target
    score = module.score(decode(target, outputs), decode(target, list(valid.tgt)))[name]
    return {f"valid/{name}": score}


def keep_for_averaging(run: Run, cfg: TrainConfig):
    """train.average_every: the weights at this step, for averaging; the ones ``average_last`` saves back go."""
    step = run.state["step"]
    run.save_model({"step": step}, run.checkpoint_dir / f"step-{step}.pt")
    if run.ctx.is_main:
        (run.checkpoint_dir / f"step-{step - cfg.average_every * cfg.average_last}.pt").unlink(missing_ok=True)


def averaged_paths(run: Run, cfg: TrainConfig) -> tuple[list[Path], str]:
    """The last ``average_last`` weights saved for averaging, latest first: every ``average_every`` steps, or
    at each epoch's end; and what they are."""
    if cfg.average_every:
        last = range(run.state["step"] // cfg.average_every * cfg.average_every, 0, -cfg.average_every)
        paths, unit = [run.checkpoint_dir / f"step-{s}.pt" for s in last], "checkpoints"
    else:
        paths, unit = [run.checkpoint_dir / f"epoch-{e}.pt" for e in range(run.state["epoch"], 0, -1)], "epochs"
    return [path for path in paths[:cfg.average_last] if path.is_file()], unit


def averaged_model(run: Run, cfg: TrainConfig, valid: Pairs) -> Path | None:
    """The average of the last ``average_last`` epochs' (or checkpoints') weights, when it validates better
    than the best.

    Rank 0 alone decides: it wrote the weights, and it alone writes model.pt.
    """
    if not run.ctx.is_main:
        return None
    last, unit = averaged_paths(run, cfg)
    if len(last) < 2:
        return None
    trainee = run.trainee
    trainee.model.load_state_dict(average_weights(last))
    valid_loss = mean_loss(trainee.model, valid, trainee.ids, cfg.max_tokens, trainee.device, cfg.fast)
    log.info("average of the last %d %s: valid loss %.4f (best single epoch %.4f)", len(last), unit, valid_loss,
             run.state["best_valid_loss"])
    run.log(**{"valid/averaged_loss": valid_loss})
    if valid_loss >= run.state["best_valid_loss"]:
        return None
    path = run.checkpoint_dir / "averaged.pt"
    run.save_model({"step": run.state["step"], "valid_loss": valid_loss, f"averaged_{unit}": len(last),
                    **({"average_every": cfg.average_every} if cfg.average_every else {})}, path)
    return path


def average_weights(paths: list[Path]) -> dict:
    """The element-wise mean of several saved models' weights (checkpoint averaging)."""
    states = [checkpoint.load(path, remedy=f"delete {path.parent} to train from the start")["model"]
              for path in paths]
    return {name: sum(state[name].double() for state in states).div(len(states)).to(states[0][name].dtype)
            for name in states[0]}


# --- The decoder-only language model -------------------------------------------------------------

def random_blocks(ids: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator):
    """B random contiguous blocks: inputs (B, T) and targets, the same shifted by one (B, T)."""
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)  # (B,)
    window = starts[:, None] + torch.arange(block_size + 1)  # (B, T + 1)
    tokens = ids[window]  # (B, T + 1)
    return tokens[:, :-1], tokens[:, 1:]


def lm_lr(step: int, cfg: LMTrainConfig) -> float:
    if cfg.schedule == "cosine":
        return cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.max_iters)
    # Noam with its factor chosen so that the peak, at step == warmup, is cfg.lr.
    factor = cfg.lr * cfg.model.d_model**0.5 * cfg.warmup**0.5
    return noam_lr(step, cfg.model.d_model, cfg.warmup, factor)


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


def lm_eval_sets(cfg: LMTrainConfig, train: torch.Tensor, valid: torch.Tensor) -> dict:
    """The same batches at every estimate, so that the curves move only with the model."""
    for split, ids in (("train", train), ("valid", valid)):
        if len(ids) <= cfg.block_size:
            raise ConfigError(f"train.block_size: {cfg.block_size} is not shorter than the {split} split "
                              f"({len(ids)} tokens)")
    fixed = torch.Generator().manual_seed(cfg.seed + 1)
    return {name: [random_blocks(ids, cfg.batch_size, cfg.block_size, fixed) for _ in range(cfg.eval_batches)]
            for name, ids in (("train", train), ("valid", valid))}


def train_lm(task, cfg: LMTrainConfig, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir) -> dict:
    """``max_iters`` steps of random blocks; model.pt the weights of the best validation loss."""
    sampler = torch.Generator().manual_seed(cfg.seed)
    trainee = set_up(task, cfg, tokenizer_dir)
    model, device, ctx = trainee.train_model, trainee.device, trainee.ctx
    optimizer = torch.optim.AdamW(weight_decay_groups(trainee.model, cfg.weight_decay), lr=0.0,
                                  betas=(0.9, cfg.beta2), fused=True)
    run = Run(trainee, cfg, optimizer, ("max_iters", "step"), {}, {"sampler": sampler}, data_dir, tokenizer_dir,
              checkpoint_dir, live_dir, schedule_uses_length=cfg.schedule == "cosine")
    train = encode_text(trainee.tokenizers.target, read_text(data_dir, "train"))
    eval_sets = lm_eval_sets(cfg, train, encode_text(trainee.tokenizers.target, read_text(data_dir, "valid")))
    if cfg.batch_size % ctx.world:
        raise ConfigError(f"train.batch_size: {cfg.batch_size} does not divide among {ctx.world} processes")
    blocks = cfg.batch_size * cfg.accumulate  # every step's, and its tokens and FLOPs
    tokens = blocks * cfg.block_size
    flops = training_flops(cfg.model, trainee.vocab["tgt_vocab_size"], [], [cfg.block_size] * blocks)
    run.open()

    trainee.model.train()
    clock = StepClock()
    with signals.held_to_step_ends(ctx.world == 1), \
            tqdm(range(run.state["step"], cfg.max_iters), initial=run.state["step"], total=cfg.max_iters,
                 leave=False, disable=None if ctx.is_main else True) as progress:  # as in seq2seq
        for _ in progress:
            clock.start()
            run.state["step"] += 1
            step = run.state["step"]
            lr = lm_lr(step, cfg)
            set_lr(optimizer, lr)
            loss_sum = torch.zeros((), device=device)
            for j in range(cfg.accumulate):
                x, y = random_blocks(train, cfg.batch_size, cfg.block_size, sampler)  # a global batch
                x, y = x[ctx.rank::ctx.world], y[ctx.rank::ctx.world]  # this process's rows
                with distributed.accumulating(model, last=j + 1 == cfg.accumulate):
                    with trainee.autocast():
                        batch_loss = lm_loss(model, to_device(x, device), to_device(y, device))
                    (batch_loss / cfg.accumulate).backward()  # equal batches: the step's mean is the mean of means
                loss_sum += batch_loss.detach()
            loss = distributed.sum_over_processes(loss_sum, ctx) / (ctx.world * cfg.accumulate)
            grad_norm = torch.nn.utils.clip_grad_norm_(trainee.model.parameters(), cfg.clip_norm, foreach=True)
            loss, grad_norm = read_back(loss, grad_norm)
            seconds = clock.lap()
            run.check_finite(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            run.log(**{"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
                       **speed(tokens, flops, seconds, trainee.peak_tflops)})
            progress.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")
            if step % cfg.eval_every == 0 or step == cfg.max_iters:
                train_loss = estimate_loss(trainee.model, eval_sets["train"], device)
                valid_loss = estimate_loss(trainee.model, eval_sets["valid"], device)
                log.info("step %d: train loss %.4f, valid loss %.4f", step, train_loss, valid_loss)
                run.log(**{"eval/train_loss": train_loss})
                run.record_validation(valid_loss, {"block_size": cfg.block_size})
                clock.pause()
            if step % cfg.checkpoint_every == 0 or step == cfg.max_iters or signals.stop_requested():
                run.save_last()
                clock.pause()
                signals.stop_if_requested()
    return run.finish(model_path)


def run(task, cfg, data_dir, tokenizer_path, model_path, checkpoint_dir, live_dir) -> dict:
    """The train stage: the loop that fits the task's kind, one trainer at a time on ``checkpoint_dir`` (a
    second, a `dvc repro` started while an orphaned one still runs, would interleave their curves)."""
    lm = get_task(task).KIND == "lm"
    loop = train_lm if lm else train_seq2seq
    checkpoint_dir = Path(checkpoint_dir)
    alone = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 holds it for the run's processes
    try:
        with held_alone(checkpoint_dir.with_name(checkpoint_dir.name + ".lock"), str(checkpoint_dir)) if alone \
                else contextlib.nullcontext():
            return loop(task, cfg, data_dir, tokenizer_path, model_path, checkpoint_dir, live_dir)
    except RuntimeError as err:  # torch.OutOfMemoryError is one
        said = out_of_memory(err)
        if not said:
            raise
        raise out_of_memory_error(said, cfg, lm) from None
