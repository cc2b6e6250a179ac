"""The decoder-only LM's training loop (nanoGPT's recipe), read top to bottom: iterations over random
contiguous blocks with AdamW and a cosine or Noam schedule.
Dims: B batch, T block length, V vocabulary.
"""

import logging

import torch
from tqdm import tqdm

from lib.core import distributed, signals
from lib.core.config import ConfigError
from lib.core.sections import LMTrainConfig
from lib.data.pairs import read_text, to_device
from lib.data.tokenizer import encode_text
from lib.model.losses import estimate_loss, lm_loss
from lib.model.hardware import speed, training_flops
from lib.model.setup import set_up
from lib.train.run import Run
from lib.train.steps import StepClock, clip, read_back, set_lr
from transformer.schedules import cosine_lr, noam_lr

log = logging.getLogger(__name__)


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


def step_work(cfg: LMTrainConfig, vocab_size: int) -> tuple[int, float]:
    """The tokens and the FLOPs of every step: ``batch_size`` x ``accumulate`` blocks."""
    blocks = cfg.batch_size * cfg.accumulate
    return blocks * cfg.block_size, training_flops(cfg.model, vocab_size, [], [cfg.block_size] * blocks)


def train_lm(task, cfg: LMTrainConfig, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir, family) -> dict:
    """``max_iters`` steps of random blocks; model.pt the weights of the best validation loss. ``family``:
    lib.train.families' (its loop calls this one)."""
    sampler = torch.Generator().manual_seed(cfg.seed)
    trainee = set_up(task, cfg, tokenizer_dir, family)
    model, device, ctx = trainee.train_model, trainee.device, trainee.ctx
    optimizer = torch.optim.AdamW(weight_decay_groups(trainee.model, cfg.weight_decay), lr=0.0,
                                  betas=(0.9, cfg.beta2), fused=True)
    run = Run(trainee, cfg, optimizer, length=("max_iters", "step"), generators={"sampler": sampler},
              data_dir=data_dir, tokenizer_dir=tokenizer_dir, checkpoint_dir=checkpoint_dir, live_dir=live_dir,
              schedule_uses_length=cfg.schedule == "cosine")
    train = encode_text(trainee.tokenizers.target, read_text(data_dir, "train"))
    eval_sets = lm_eval_sets(cfg, train, encode_text(trainee.tokenizers.target, read_text(data_dir, "valid")))
    if cfg.batch_size % ctx.world:
        raise ConfigError(f"train.batch_size: {cfg.batch_size} does not divide among {ctx.world} processes")
    tokens, flops = step_work(cfg, trainee.vocab["tgt_vocab_size"])
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
            grad_norm = clip(trainee.model.parameters(), cfg.clip_norm)
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
    run.record_stop("max_iters", f"trained {cfg.max_iters} steps (train.max_iters)")
    return run.finish(model_path)
