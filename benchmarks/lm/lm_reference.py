"""The LM at nanoGPT's documented CPU configuration: validation loss and time per iteration.

nanoGPT's README CPU run (shakespeare_char): 4 layers, 4 heads, width 128,
block 64, batch 12, 2,000 iterations, dropout 0, on the same 90/10 split.
Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/lm/lm_reference.py [--source PATH] [--lr 2e-3] [--norm-first]
Prints one JSON object. Ours, trained by the train stage's loop: the wall time
of the whole run and its ms per iteration, the median training step as the
run logged it (what nanoGPT's log reports per iteration), the validation loss
over the whole validation split and nanoGPT-style (mean of 20 random batches).
Then the same for a replica of nanoGPT (its model and its training loop,
rebuilt here in plain torch) trained next in the same process, and bare step
times of both models measured in turns on the same batches.
"""

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lib.model import checkpoint
from lib.train import lm as lm_loop
from lib.train.families import TRAINING
from lib.core.config import ModelConfig
from lib.core.sections import LMTrainConfig, TokenizeConfig
from lib.data.pairs import read_text
from lib.evaluate.evaluation import split_loss
from lib.train.lm import weight_decay_groups
from transformer.schedules import cosine_lr
from transformer.model import build_model
from lib.tasks import shakespeare
from lib.tasks.writing import run_fetch, run_prepare
from lib.data.tokenizer import encode_text, load_tokenizers
from lib.tasks.writing import run_tokenize
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]


class NanoGPTReplica(nn.Module):
    """nanoGPT's model as its README and paper trail describe it, rebuilt in plain torch as
    a yardstick (never used by lib/): learned positions, Pre-LN blocks with bias-free
    LayerNorm and linear layers, one fused QKV projection, torch's fused causal
    scaled-dot-product attention, a 4x GELU MLP, a final LayerNorm and a head tied to
    the token embedding; weights N(0, 0.02), the residual projections scaled by
    1/sqrt(2 * layers). At width 128 and 4 layers it has nanoGPT's 0.80M parameters."""

    def __init__(self, vocab_size: int, width: int, heads: int, layers: int, block: int):
        super().__init__()
        self.heads = heads
        self.tokens, self.positions = nn.Embedding(vocab_size, width), nn.Embedding(block, width)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "norm1": nn.LayerNorm(width, bias=False), "qkv": nn.Linear(width, 3 * width, bias=False),
            "attn_out": nn.Linear(width, width, bias=False), "norm2": nn.LayerNorm(width, bias=False),
            "fc": nn.Linear(width, 4 * width, bias=False), "fc_out": nn.Linear(4 * width, width, bias=False),
        }) for _ in range(layers))
        self.norm = nn.LayerNorm(width, bias=False)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.tokens.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("attn_out.weight", "fc_out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        B, T = ids.shape
        x = self.tokens(ids) + self.positions(torch.arange(T))
        for b in self.blocks:
            q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in b["qkv"](b["norm1"](x)).chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            x = x + b["attn_out"](y)
            x = x + b["fc_out"](F.gelu(b["fc"](b["norm2"](x))))
        return self.head(self.norm(x))


def replica_optimizer(model: nn.Module, lr: float) -> torch.optim.AdamW:
    """nanoGPT's AdamW on CPU: decay on 2-D parameters only, betas (0.9, 0.99), not fused."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.99))


def train_replica(train: torch.Tensor, valid: torch.Tensor, vocab_size: int, args) -> dict:
    """nanoGPT's training loop at its documented CPU run: random blocks, cosine schedule
    with warmup, clip 1.0, a 20-batch estimate of both losses every 250 iterations and at
    the end; an iteration's time as its log prints it (estimates not included)."""
    torch.manual_seed(1337)
    model = NanoGPTReplica(vocab_size, 128, 4, 4, 64).train()
    optimizer = replica_optimizer(model, args.lr)

    def batch(ids):  # nanoGPT's get_batch, slice by slice (not lib's random_blocks): its cost is part of its step
        ix = torch.randint(len(ids) - 64, (12,))
        return torch.stack([ids[i:i + 64] for i in ix]), torch.stack([ids[i + 1:i + 65] for i in ix])

    def loss_of(x, y):
        return F.cross_entropy(model(x).view(-1, vocab_size), y.view(-1))

    @torch.no_grad()
    def estimate(ids):
        model.eval()
        loss = sum(loss_of(*batch(ids)).item() for _ in range(20)) / 20
        model.train()
        return loss

    step_s, valid_loss = [], math.inf
    start = time.perf_counter()
    for it in range(args.iters + 1):
        if it % 250 == 0 or it == args.iters:
            valid_loss = estimate(valid)
        if it == args.iters:
            break
        began = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(it, args.lr, args.min_lr, args.warmup, args.iters)
        loss = loss_of(*batch(train))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        step_s.append(time.perf_counter() - began)
    return {"wall_s": round(time.perf_counter() - start, 1),
            "ms_per_iter_median": round(statistics.median(step_s) * 1000, 1),
            "valid_loss_estimate_20_batches": round(valid_loss, 4),
            "params_m": round(sum(p.numel() for p in model.parameters() if p is not model.positions.weight) / 1e6, 2)}


def step_times(runs: dict, batches: list[torch.Tensor], rounds: int = 4, clip_norm: float = 1.0) -> dict:
    """Seconds a training step of each (model, optimizer, precision), one figure per round: the models are
    timed in turns, round after round, on the same batches of tokens (B, T + 1), so that a noisy machine
    slows them alike. Round 0 warms up and is left out. Also benchmarks/lm/lm_variants.py's."""
    seconds = {name: [] for name in runs}
    for round_ in range(rounds + 1):
        for name, (model, optimizer, precision) in runs.items():
            start = time.perf_counter()
            for x in batches:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = lm_loop.lm_loss(model, x[:, :-1], x[:, 1:])
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm, foreach=True)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                loss.item()
            if round_:
                seconds[name].append((time.perf_counter() - start) / len(batches))
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(ROOT.parent / "shared/data/tinyshakespeare/input.txt"))
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--d-ff", type=int, default=512)
    parser.add_argument("--norm-first", action="store_true")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="ours only (nanoGPT's CPU run is fp32): bf16 autocast")
    args = parser.parse_args()

    model = ModelConfig(d_model=128, n_heads=4, encoder_layers=0, decoder_layers=4, d_ff=args.d_ff, dropout=0.0,
                        norm_first=args.norm_first, tie_embeddings=True, fused_qkv=True, max_len=64,
                        bias=False)
    cfg = LMTrainConfig(seed=1337, device="cpu", max_iters=args.iters, batch_size=12, block_size=64,
                        schedule="cosine", lr=args.lr, min_lr=args.min_lr, warmup=args.warmup, weight_decay=0.1,
                        beta2=0.99, clip_norm=1.0, eval_every=args.iters, eval_batches=20,
                        checkpoint_every=args.iters, precision=args.precision, model=model)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_fetch("shakespeare", shakespeare.FetchConfig(source=args.source), tmp / "sources")
        run_prepare("shakespeare", shakespeare.PrepareConfig(train_fraction=0.9), tmp / "data", tmp / "sources")
        run_tokenize("shakespeare", TokenizeConfig(kind="char", min_frequency=1), tmp / "data", tmp / "tok")
        start = time.perf_counter()
        TRAINING["lm"].train("shakespeare", cfg, tmp / "data", tmp / "tok", tmp / "model.pt", tmp / "ckpt",
                             tmp / "live")
        wall = time.perf_counter() - start
        steps = (tmp / "live" / "plots" / "metrics" / "train" / "loss.tsv").read_text().count("\n") - 1
        # What nanoGPT's log calls "time per iteration": each training step's own wall time, as the
        # train stage logged it (train/tokens_per_s over the step's 12 x 64 tokens), the median.
        rates = (tmp / "live" / "plots" / "metrics" / "train" / "tokens_per_s.tsv").read_text().split("\n")[1:]
        step_ms = statistics.median(12 * 64 / float(line.split("\t")[-1]) * 1000 for line in rates if line)
        model_, state = checkpoint.load_model(tmp / "model.pt")
        tokenizer = load_tokenizers(tmp / "tok").target
        train, valid = (encode_text(tokenizer, read_text(tmp / "data", split)) for split in ("train", "valid"))
        full_valid = split_loss(model_, valid, 64)
        vocab_size = tokenizer.get_vocab_size()
    replica = train_replica(train, valid, vocab_size, args)
    ours = build_model(model, "lm", vocab_size, vocab_size, joint_vocab=True, fast=True).train()
    ours_optimizer = torch.optim.AdamW(weight_decay_groups(ours, 0.1), betas=(0.9, 0.99), fused=True)
    reference = NanoGPTReplica(vocab_size, 128, 4, 4, 64).train()
    batches = [torch.randint(vocab_size, (12, 65)) for _ in range(50)]
    seconds = step_times({"ours": (ours, ours_optimizer, args.precision),
                          "nanogpt_replica": (reference, replica_optimizer(reference, 1e-3), "fp32")}, batches)
    timed = {name: round(statistics.mean(times) * 1000, 1) for name, times in seconds.items()}
    # ms_per_iter_whole_run: the training run's wall time over its steps (start-up and one
    # evaluation included). ms_per_step_alternating: bare training steps of our model and of
    # the nanoGPT replica, each with its own optimizer, timed in turns on the same batches.
    print(json.dumps({
        **header("lm_reference"),
        "config": {"layers": 4, "heads": 4, "width": 128, "d_ff": args.d_ff, "block": 64, "batch": 12,
                   "iters": args.iters, "lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup,
                   "norm_first": args.norm_first, "precision": args.precision},
        "wall_s": round(wall, 1), "ms_per_iter_whole_run": round(wall / steps * 1000, 1),
        "ms_per_iter_median": round(step_ms, 1),
        "ms_per_step_alternating": timed,
        "valid_loss_estimate_20_batches": round(state["valid_loss"], 4),
        "valid_loss_full_split": round(full_valid, 4),
        "nanogpt_replica": replica,
    }, indent=2))


if __name__ == "__main__":
    main()
