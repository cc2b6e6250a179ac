"""The LM at nanoGPT's documented CPU configuration: validation loss and time per iteration.

nanoGPT's README CPU run (shakespeare_char): 4 layers, 4 heads, width 128,
block 64, batch 12, 2,000 iterations, dropout 0, on the same 90/10 split.
Run from the repository root with the venv active:
    python benchmarks/lm_reference.py [--source PATH] [--lr 2e-3] [--norm-first]
Prints one JSON object: the wall time of the whole run and its ms per
iteration, the median training step as the run logged it (what nanoGPT's log
reports per iteration), the validation loss over the whole validation split and
nanoGPT-style (mean of 20 random batches), and bare step times of our model
and of a nanoGPT-shaped model built from torch's own modules, alternating.
"""

import argparse
import json
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lib import checkpoint, training
from lib.config import LMTrainConfig, ModelConfig, TokenizeConfig
from lib.data import read_text
from lib.evaluation import split_loss
from lib.model import build_model
from lib.tasks import run_prepare, shakespeare
from lib.tokenizer import encode_text, load_tokenizers, run as run_tokenize

ROOT = Path(__file__).resolve().parents[1]


class TorchReferenceLM(nn.Module):
    """nanoGPT's shape from torch's own modules (a reference, never used by lib/):
    learned positions, Pre-LN blocks with GELU, fused scaled-dot-product attention, tied head."""

    def __init__(self, vocab_size: int, width: int, heads: int, layers: int, d_ff: int, block: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab_size, width), nn.Embedding(block, width)
        layer = nn.TransformerEncoderLayer(width, heads, d_ff, 0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, ids):
        T = ids.size(1)
        x = self.tokens(ids) + self.positions(torch.arange(T))
        x = self.blocks(x, mask=nn.Transformer.generate_square_subsequent_mask(T), is_causal=True)
        return self.head(self.norm(x))


def step_times(models: dict, vocab_size: int, steps: int, rounds: int = 4) -> dict:
    """ms per training step of each model, measured alternately on the same random batches."""
    batches = [torch.randint(vocab_size, (12, 65)) for _ in range(steps)]
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.99), fused=True)
                  for name, m in models.items()}
    totals = dict.fromkeys(models, 0.0)
    for round_ in range(rounds + 1):  # round 0 warms up
        for name, model in models.items():
            start = time.perf_counter()
            for x in batches:
                loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, vocab_size), x[:, 1:].reshape(-1))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                optimizers[name].step()
                optimizers[name].zero_grad(set_to_none=True)
            if round_:
                totals[name] += time.perf_counter() - start
    return {name: round(total / (rounds * steps) * 1000, 1) for name, total in totals.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(ROOT.parent / "shared/data/tinyshakespeare/input.txt"))
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--d-ff", type=int, default=512)
    parser.add_argument("--norm-first", action="store_true")
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()

    model = ModelConfig(d_model=128, n_heads=4, encoder_layers=0, decoder_layers=4, d_ff=args.d_ff, dropout=0.0,
                        norm_first=args.norm_first, tie_embeddings=True, fused_qkv=True, max_len=64)
    cfg = LMTrainConfig(seed=1337, device="cpu", max_iters=args.iters, batch_size=12, block_size=64,
                        schedule="cosine", lr=args.lr, min_lr=args.min_lr, warmup=args.warmup, weight_decay=0.1,
                        beta2=0.99, clip_norm=1.0, eval_every=args.iters, eval_batches=20,
                        checkpoint_every=args.iters, model=model)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_prepare("shakespeare", shakespeare.PrepareConfig(source=args.source, train_fraction=0.9), tmp / "data")
        run_tokenize("shakespeare", TokenizeConfig(kind="char", min_frequency=1), tmp / "data", tmp / "tok")
        start = time.perf_counter()
        training.train_lm("shakespeare", cfg, tmp / "data", tmp / "tok", tmp / "model.pt", tmp / "ckpt",
                          tmp / "live")
        wall = time.perf_counter() - start
        steps = (tmp / "live" / "plots" / "metrics" / "train" / "loss.tsv").read_text().count("\n") - 1
        # What nanoGPT's log calls "time per iteration": each training step's own wall time, as the
        # train stage logged it (train/tokens_per_s over the step's 12 x 64 tokens), the median.
        rates = (tmp / "live" / "plots" / "metrics" / "train" / "tokens_per_s.tsv").read_text().split("\n")[1:]
        step_ms = statistics.median(12 * 64 / float(line.split("\t")[-1]) * 1000 for line in rates if line)
        model_, state = checkpoint.load_model(tmp / "model.pt")
        valid = encode_text(load_tokenizers(tmp / "tok").target, read_text(tmp / "data", "valid"))
        full_valid = split_loss(model_, valid, 64)
        vocab_size = load_tokenizers(tmp / "tok").target.get_vocab_size()
    ours = build_model(model, "lm", vocab_size, vocab_size, joint_vocab=True).train()
    reference = TorchReferenceLM(vocab_size, 128, 4, 4, args.d_ff, 64).train()
    timed = step_times({"ours": ours, "torch_reference": reference}, vocab_size, steps=50)
    # ms_per_iter_whole_run: the training run's wall time over its steps (start-up and one
    # evaluation included). ms_per_step_alternating: bare training steps of our model and of a
    # nanoGPT-shaped model built from torch's modules, timed in turns on the same batches.
    print(json.dumps({
        "benchmark": "lm_reference", "date": date.today().isoformat(),
        "config": {"layers": 4, "heads": 4, "width": 128, "d_ff": args.d_ff, "block": 64, "batch": 12,
                   "iters": args.iters, "lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup,
                   "norm_first": args.norm_first},
        "wall_s": round(wall, 1), "ms_per_iter_whole_run": round(wall / steps * 1000, 1),
        "ms_per_iter_median": round(step_ms, 1),
        "ms_per_step_alternating": timed,
        "valid_loss_estimate_20_batches": round(state["valid_loss"], 4),
        "valid_loss_full_split": round(full_valid, 4),
        "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
    }, indent=2))


if __name__ == "__main__":
    main()
