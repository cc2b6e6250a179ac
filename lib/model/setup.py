"""What a training run sets up before its first step: the device and processes, the tokenizers, the model
(seeded, built, on its device, wrapped for DDP and compiled when asked), the precision, and what the model
file records of how it was trained."""

import logging
from dataclasses import dataclass

import torch
from torch import nn

from lib.core import distributed
from lib.data.pairs import SpecialIds
from lib.model.device import autocast, open_device, peak_tflops, resolve_precision
from lib.model.initial import start_from
from lib.data.tokenizer import Tokenizers, load_tokenizers, special_ids
from transformer.fast.compile import compile_model
from transformer.model import build_model, parameter_counts

log = logging.getLogger(__name__)


@dataclass
class Trainee:
    """A model ready to train, and where and how it trains."""
    task: str
    family: str  # the model family's name, as model.pt records it (lib.core.families)
    model: nn.Module  # whose weights are saved
    train_model: nn.Module  # what forward and backward go through: the model, DDP-wrapped or compiled
    tokenizers: Tokenizers
    ids: SpecialIds
    vocab: dict  # src_vocab_size, tgt_vocab_size and joint_vocab, as build_model takes them
    device: torch.device
    ctx: distributed.Context
    precision: str  # fp32 or bf16
    peak_tflops: float
    trained_with: dict  # what model.pt records of how it was trained

    def autocast(self):
        return autocast(self.precision, self.device)


def set_up(task: str, cfg, tokenizer_dir, family) -> Trainee:
    """The Trainee of train config ``cfg``: the same weights in every process, dropout masks of its own.
    ``family``: the task's lib.train.families object, which says what its model reads and what model.pt records."""
    device, ctx = open_device(cfg.device)
    tokenizers = load_tokenizers(tokenizer_dir)
    ids = special_ids(tokenizers)
    vocab = {"src_vocab_size": tokenizers.source.get_vocab_size(),
             "tgt_vocab_size": tokenizers.target.get_vocab_size(), "joint_vocab": tokenizers.joint}
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, family.name, **vocab, fast=cfg.fast)
    if cfg.init_from:  # after the random weights, so that dropout and batches draw as a run from scratch does
        start_from(model, cfg.init_from, family.name, vocab, tokenizers)
    distributed.seed_own_stream(cfg.seed, ctx)
    model.to(device)
    *parts, (_, total) = parameter_counts(model).items()
    log.info("model: %s parameters (%s)", f"{total:,}", ", ".join(f"{part} {n:,}" for part, n in parts))
    # The task (another task's stages refuse the model), and for the report the label smoothing (the least
    # loss it lets training reach) and how often the untrained model predicted the token it was given.
    trained_with = {"task": task, "initial_repeats_input": round(repeats_input(model, ids, family.logits), 4),
                    **family.recorded(cfg), **({"init_from": cfg.init_from} if cfg.init_from else {})}
    train_model = distributed.wrap(model, ctx, device)
    if cfg.compile:
        log.info("train.compile: the first step compiles the model (a minute or two on a GPU)")
        train_model = compile_model(train_model, family.name)
    precision = resolve_precision(cfg.precision, device)
    peak = peak_tflops(cfg.peak_tflops, precision, device)
    return Trainee(task, family.name, model, train_model, tokenizers, ids, vocab, device, ctx, precision, peak,
                   trained_with)


@torch.no_grad()
def repeats_input(model: nn.Module, ids: SpecialIds, logits, batch: int = 64, length: int = 16) -> float:
    """The share of positions whose top prediction is the token the model was just given, on random tokens
    other than the special ``ids``: by chance, 1 / (V - 4). ``logits(model, tokens, given, pad)``: the model's
    outputs for the ``given`` tokens, ``tokens(vocab_size)`` drawing any other input it reads (its family's).

    Measured on an untrained model: a decoder whose input vectors are also its output layer's rows
    (tie_embeddings), when they outweigh the rest of its residual stream, starts out repeating its input
    (benchmarks/length_study/tie_start.py). A generator of its own leaves the model's random-number state as it was.
    """
    generator, device = torch.Generator().manual_seed(0), model.generator.weight.device
    length, special = min(length, model.cfg.max_len), {ids.pad, ids.bos, ids.eos, ids.unk}

    def tokens(vocab_size: int) -> torch.Tensor:  # (batch, length) ids, none of them special
        plain = torch.tensor([i for i in range(vocab_size) if i not in special])
        return plain[torch.randint(len(plain), (batch, length), generator=generator)].to(device)

    given = tokens(model.generator.out_features)
    training = model.training
    model.eval()
    found = logits(model, tokens, given, ids.pad)
    model.train(training)
    return (found.argmax(-1) == given).float().mean().item()
