"""The encoder-decoder's training loop (sec. 5 of the paper), read top to bottom: epochs of token-budget
batches with Adam, Noam warmup and label smoothing. Every step: set the learning rate, forward, loss, backward,
clip, step, zero the gradients, log. Set-up (lib.model.setup) and bookkeeping (lib.train.run) live beside it.
"""

import functools
import logging

import torch
from tqdm import tqdm

from lib.core import distributed, signals
from lib.core.sections import TrainConfig
from lib.data.pairs import Pairs, collate, read_split, token_budget_batches
from lib.data.token_store import MappedPairs, meta_path
from lib.data.tokenizer import decode, encode_pairs
from lib.model.lengths import check_budget, check_evaluated_lengths, fit_lengths
from lib.model.losses import mean_loss, seq2seq_loss
from lib.model.hardware import training_flops
from lib.model.setup import set_up
from lib.model.translate import greedy_translate
from lib.tasks import get_task
from lib.train.averaging import averaged_model, averaging_step, keep_for_averaging
from lib.train.run import Run
from lib.train.steps import Readings, StepClock, clip, set_lr
from transformer.schedules import cooldown_factor, noam_lr

log = logging.getLogger(__name__)


def stop_reason(cfg: TrainConfig, state: dict) -> tuple[str, str] | None:
    """Why training stops before its next epoch: the train param and a sentence; or None to go on."""
    if state["epoch"] >= cfg.epochs:
        return "epochs", f"trained {cfg.epochs} epoch{'s' * (cfg.epochs != 1)} (train.epochs)"
    if cfg.max_steps and state["step"] >= cfg.max_steps:
        return "max_steps", f"trained {cfg.max_steps} steps (train.max_steps)"
    if cfg.time_budget_minutes and state["elapsed_s"] >= 60 * cfg.time_budget_minutes:
        return "time_budget_minutes", (f"spent {state['elapsed_s'] / 60:.1f} minutes (train.time_budget_minutes: "
                                       f"{cfg.time_budget_minutes})")
    if cfg.patience and state["epochs_since_best"] >= cfg.patience:
        return "patience", f"no better validation loss for {cfg.patience} epochs (train.patience)"
    return None


def seq2seq_lr(cfg: TrainConfig, step: int, planned: int, elapsed_s: float) -> float:
    """Step ``step``'s rate: Noam's (eq. 3), cooled over train.cooldown's share of the run toward whichever end
    comes first, the ``planned`` steps or the time budget (from the ``elapsed_s`` training seconds)."""
    factor = cooldown_factor(step - 1, planned, cfg.cooldown)
    if cfg.cooldown and cfg.time_budget_minutes:
        factor = min(factor, cooldown_factor(elapsed_s, 60 * cfg.time_budget_minutes, cfg.cooldown))
    return factor * noam_lr(step, cfg.model.d_model, cfg.warmup, cfg.lr_factor)


def epoch_batches(train: Pairs, cfg: TrainConfig, epoch: int) -> list[list[int]]:
    """The epoch's batches, in its own order (seeded by train.seed and the epoch)."""
    order = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
    return token_budget_batches(train, cfg.max_tokens, order, cfg.batch_unit)


def planned_steps(train: Pairs, cfg: TrainConfig) -> int:
    """The optimizer steps of train.epochs (or max_steps, when fewer): the end a cooldown aims at. Padded batches
    are as many in every epoch, since the sorted lengths alone decide them; real ones are counted epoch by epoch."""
    counted = range(1 if cfg.batch_unit == "padded" else cfg.epochs)
    steps = [-(-len(epoch_batches(train, cfg, epoch)) // cfg.accumulate) for epoch in counted]
    total = sum(steps) * (cfg.epochs if cfg.batch_unit == "padded" else 1)
    return min(total, cfg.max_steps) if cfg.max_steps else total


def encoded_split(tokenizers, data_dir, tokenizer_dir, split: str) -> Pairs:
    """A split's pairs as token ids: memory-mapped where the tokenize stage wrote them (a corpus of millions,
    ``token_store``), else encoded here."""
    if meta_path(tokenizer_dir, split).is_file():
        return MappedPairs(tokenizer_dir, split)
    return encode_pairs(tokenizers, read_split(data_dir, split))


def seq2seq_splits(run: Run, cfg: TrainConfig, data_dir, tokenizer_dir) -> tuple[Pairs, Pairs]:
    """The train and valid pairs, encoded; every split evaluate decodes checked to fit first."""
    task, tokenizers = run.trainee.task, run.trainee.tokenizers
    (train, train_skipped), (valid, valid_skipped) = (
        fit_lengths(encoded_split(tokenizers, data_dir, tokenizer_dir, split), cfg.model.max_len, split, cfg.too_long)
        for split in ("train", "valid"))
    if train_skipped or valid_skipped:  # model.pt says so, and the report (a file without them: none skipped)
        run.trainee.trained_with["skipped_too_long"] = {"train": train_skipped, "valid": valid_skipped}
    check_evaluated_lengths(task, {split: encode_pairs(tokenizers, read_split(data_dir, split))
                                   for split in get_task(task).evaluated_splits}, cfg.model.max_len)
    check_budget(train, cfg.max_tokens)
    return train, valid


def train_seq2seq(task, cfg: TrainConfig, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir,
                  family) -> dict:
    """Epochs of token-budget batches until ``stop_reason``; model.pt the best (or averaged) weights. ``family``:
    lib.train.families' (its loop calls this one)."""
    trainee = set_up(task, cfg, tokenizer_dir, family)
    # fused: one pass over each parameter, where the foreach kernels take two on a CPU
    optimizer = torch.optim.Adam(trainee.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True)
    # A cooldown aims at the run's end, so that the params setting it change the schedule: no resuming across them.
    ends = () if cfg.cooldown else ("max_steps", "time_budget_minutes")
    run = Run(trainee, cfg, optimizer, length=("epochs", "epoch"),
              counters={"epoch": 0, "batches_done": 0, "elapsed_s": 0.0, "epochs_since_best": 0,
                        "valid_scores": []},
              data_dir=data_dir, tokenizer_dir=tokenizer_dir, checkpoint_dir=checkpoint_dir, live_dir=live_dir,
              stop_keys=(*ends, "patience", "average_last", "average"), schedule_uses_length=bool(cfg.cooldown))
    train, valid = seq2seq_splits(run, cfg, data_dir, tokenizer_dir)
    planned = planned_steps(train, cfg) if cfg.cooldown else 0
    run.open()
    trainee.model.train()
    clock = StepClock()
    with signals.held_to_step_ends(run.ctx.world == 1):
        while (reason := stop_reason(cfg, run.state)) is None:
            clock.spent()  # the epoch's time counts from here
            complete = seq2seq_epoch(run, cfg, train, clock, planned)
            clock.pause()
            end_epoch(run, cfg, valid, clock, complete)
    log.info("stopped: %s", reason[1])
    state, scores = run.state, run.state["valid_scores"]
    run.record_stop(*reason, epoch=state["epoch"] + (state["batches_done"] > 0), cooldown=cfg.cooldown,
                    planned_steps=planned, valid_metric=get_task(task).valid_metric, last_scores=scores[-2:],
                    still_rising=len(scores) >= 2 and scores[-1] > scores[-2])
    return run.finish(model_path, averaged_model(run, cfg, valid))


def load_batch(train: Pairs, ids, device, ctx, indices: list[int]):
    """This process's part of a global batch, on its way to the device, and its share of the batch."""
    rows, weight = distributed.shard(indices, ctx)
    return collate(train, rows, ids).to(device), weight


def seq2seq_epoch(run: Run, cfg: TrainConfig, train: Pairs, clock: StepClock, planned: int) -> bool:
    """The rest of the epoch's steps (all of them, unless resuming mid-epoch, or up to ``max_steps``, or with a
    cooldown to the time budget's end); returns whether the epoch is complete. Each checkpoint adds the time
    spent so far to the state. ``planned``: the run's steps, for the cooldown (``planned_steps``)."""
    trainee, optimizer, state = run.trainee, run.optimizer, run.state
    model, ids, device, ctx = trainee.train_model, trainee.ids, trainee.device, trainee.ctx
    epoch = state["epoch"]
    batches = epoch_batches(train, cfg, epoch)
    budget_s = 60 * cfg.time_budget_minutes if cfg.cooldown else 0.0  # a cooled budget ends mid-epoch
    todo = batches[state["batches_done"]:]  # resuming mid-epoch: checkpoints fall between steps' groups
    steps = [todo[i:i + cfg.accumulate] for i in range(0, len(todo), cfg.accumulate)]  # each step's batches
    load = functools.partial(load_batch, train, ids, device, ctx)
    readings = Readings(run, cfg.log_every)
    # A with: an error or Ctrl-C clears the bar too, so that the stage's one-line message starts a line.
    with tqdm(desc=f"epoch {epoch + 1}/{cfg.epochs}", initial=state["batches_done"], total=len(batches),
              leave=False, disable=None if ctx.is_main else True) as progress:  # None: at a terminal only
        upcoming, loaded = (load(todo[0]), 1) if todo else (None, 0)
        for group in steps:
            clock.start()
            rows = torch.tensor([row for indices in group for row in indices])  # the global batches'
            src_lengths, tgt_lengths = (side.tolist() for side in train.side_lengths(rows))  # eos included
            n_tokens = sum(tgt_lengths)
            elapsed = distributed.from_main(state["elapsed_s"] + clock.unspent(), ctx) if budget_s else 0.0
            if budget_s and elapsed >= budget_s:  # the rate has reached 0: the step is not taken
                break
            state["step"] += 1
            lr = seq2seq_lr(cfg, state["step"], planned, elapsed)
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
            grad_norm = clip(trainee.model.parameters(), cfg.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            flops = training_flops(cfg.model, trainee.vocab["tgt_vocab_size"], src_lengths, tgt_lengths)
            readings.add(state["step"], loss, grad_norm, lr, n_tokens + sum(src_lengths), flops)
            progress.update(len(group))
            state["batches_done"] += len(group)
            after_step(run, cfg, clock, readings, progress)
            if cfg.max_steps and state["step"] >= cfg.max_steps:
                break
        readings.flush(clock)  # the epoch's last steps
    return state["batches_done"] == len(batches)


def after_step(run: Run, cfg: TrainConfig, clock: StepClock, readings: Readings, progress: tqdm):
    """Log the steps read back (every train.log_every steps, and before any weights are saved), keep the weights
    for averaging, checkpoint, and stop on a signal."""
    state = run.state
    keep = averaging_step(cfg, state["step"])
    save = state["step"] % cfg.checkpoint_every == 0 or signals.stop_requested()
    if keep or save or readings.due(state["step"]):
        loss = readings.flush(clock)
        progress.set_postfix(loss=f"{loss:.3f}", lr=f"{run.optimizer.param_groups[0]['lr']:.2e}")
    if keep:
        keep_for_averaging(run, cfg)
    if save:
        state["elapsed_s"] += clock.spent()
        run.save_last()
        clock.pause()
        signals.stop_if_requested()


def end_epoch(run: Run, cfg: TrainConfig, valid: Pairs, clock: StepClock, complete: bool):
    """Validate, keep the epoch's weights for averaging, and checkpoint at the epoch's end. An epoch cut
    short by ``max_steps`` validates too but keeps its place: raising max_steps finishes it."""
    trainee, state = run.trainee, run.state
    epoch = state["epoch"]
    valid_loss = mean_loss(trainee.model, valid, trainee.ids, cfg.max_tokens, trainee.device, cfg.fast)
    score = validation_score(run, cfg, valid) if cfg.valid_score else {}
    log.info("epoch %d%s: valid loss %.4f%s", epoch + 1, "" if complete else f" (to step {state['step']})",
             valid_loss, "".join(f", {name.split('/')[1]} {value:.4f}" for name, value in score.items()))
    elapsed = distributed.from_main(state["elapsed_s"] + clock.spent(), run.ctx)  # validation included
    run.log(**({"epoch": epoch + 1} if complete else {}), minutes=elapsed / 60, **score)
    improved = run.record_validation(valid_loss, {})
    if score:
        state["valid_scores"].append(next(iter(score.values())))
    if complete:
        run.save_model({"step": state["step"], "valid_loss": valid_loss},
                       run.checkpoint_dir / f"epoch-{epoch + 1}.pt")
        if run.ctx.is_main:
            (run.checkpoint_dir / f"epoch-{epoch + 1 - cfg.average_last}.pt").unlink(missing_ok=True)
        state.update(epoch=epoch + 1, batches_done=0)
    state.update(elapsed_s=elapsed, epochs_since_best=0 if improved else state["epochs_since_best"] + complete)
    run.save_last()


VALID_EXTRA_TOKENS = 50  # a valid output may run this many tokens past its source (and stops at max_len)


@torch.no_grad()
def validation_score(run: Run, cfg: TrainConfig, valid: Pairs) -> dict[str, float]:
    """The task's ``valid_metric`` of the greedy outputs of the valid split, against its references as the
    tokenizer gives them back; on the main process, which alone logs."""
    trainee, chosen = run.trainee, get_task(run.trainee.task)
    name = chosen.valid_metric
    if name is None or not run.ctx.is_main:
        return {}
    model, was_training = trainee.model, trainee.model.training
    model.eval()
    outputs = greedy_translate(model, valid.src, trainee.ids, cfg.max_tokens, VALID_EXTRA_TOKENS)
    model.train(was_training)
    target = trainee.tokenizers.target
    score = chosen.score(decode(target, outputs), decode(target, list(valid.tgt)))[name]
    return {f"valid/{name}": score}
