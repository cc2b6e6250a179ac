"""Training speed of the Shakespeare LM with later models' choices: RoPE, RMSNorm, SwiGLU, fewer key/value heads.

Each variant is params.yaml's shakespeare model with a few keys changed (the same ones
docs/experiments.md trains to the end). All are timed in turns, round after round, in one
process, on the same random batches of the train stage's shape (batch_size x block_size
characters), with its optimizer (fused AdamW, weight decay on the matrices), gradient
clipping and precision (train.precision resolved for this machine), so that a noisy
machine slows them alike. Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/lm/lm_variants.py [--steps 10] [--rounds 5]
Prints one JSON object: per variant the median ms a step over the rounds, tokens a
second, parameters, and the key/value cache's bytes per token of context in float32
(what sampling keeps for every token it has read: 2 x layers x Hkv x D x 4).
"""

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

from benchmarks.lm.lm_reference import step_times
from lib.core.text import load_params
from lib.tasks.params import stage_config
from transformer.model import build_model, parameter_counts
from lib.train.training import weight_decay_groups
from lib.model.device import resolve_precision
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 69  # tiny-shakespeare's 65 characters and the 4 special tokens
LLAMA = dict(positional="rope", norm="rmsnorm", activation="swiglu", d_ff=512, n_kv_heads=2)
VARIANTS = {
    "default": {},
    "rope": dict(positional="rope"),
    "rmsnorm": dict(norm="rmsnorm"),
    "gelu": dict(activation="gelu"),
    "swiglu": dict(activation="swiglu", d_ff=512),  # 3 x 512 = 2 x 768: the same parameters
    "gqa2": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "llama": LLAMA,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps a variant a round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds after one of warm-up")
    args = parser.parse_args()

    params = load_params(ROOT / "params.yaml")
    cfg = stage_config({**params, "tasks": ["shakespeare"]}, "shakespeare", "train")
    precision = resolve_precision(cfg.precision, torch.device("cpu"))
    torch.manual_seed(0)
    batches = [torch.randint(4, VOCAB, (cfg.batch_size, cfg.block_size + 1)) for _ in range(args.steps)]
    runs = {}
    for name, changes in VARIANTS.items():
        model = build_model(dataclasses.replace(cfg.model, **changes), "lm", VOCAB, VOCAB, True, fast=True).train()
        optimizer = torch.optim.AdamW(weight_decay_groups(model, cfg.weight_decay), lr=1e-4, betas=(0.9, cfg.beta2),
                                      fused=True)
        runs[name] = model, optimizer, precision
    seconds = step_times(runs, batches, args.rounds, cfg.clip_norm)
    tokens_a_step = cfg.batch_size * cfg.block_size
    results = {}
    for name, (model, _, _) in runs.items():
        step = statistics.median(seconds[name])
        m = model.cfg
        results[name] = {"changes": VARIANTS[name], "ms_per_step": round(1000 * step, 1),
                         "tokens_per_s": round(tokens_a_step / step), "parameters": parameter_counts(model)["total"],
                         "cache_bytes_per_token": 2 * m.decoder_layers * m.kv_heads * m.head_dim * 4}
    print(json.dumps({**header("lm_variants"), "precision": precision,
                      "steps": args.steps, "rounds": args.rounds, "variants": results}, indent=1))


if __name__ == "__main__":
    main()
