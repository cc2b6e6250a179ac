"""Why the paper's weight tying slows running sums modulo 10: a tied decoder starts out repeating its input.

Its input vector for the previous token is also that token's row of the output layer, and at cumsum's scale
(a vocabulary of 14, Xavier-sized vectors times sqrt(d_model)) it outweighs the rest of the residual stream:
the untrained model's top prediction is mostly the token it was given. Modulo 10, neither the previous sum
nor the new digit alone says anything about the next digit, and training from that start sits longer on a
plateau where it knows where the output ends but not which digit comes (a loss of 2.2, against 0.57, the
label-smoothed floor).

For each variant and seed, cumsum's model (params.yaml; dropout 0) on random digits, untrained: how often
its top prediction is the decoder's input token, and the first loss (ln 14 = 2.64 knows nothing). With
--train (about 50 s a run on 2 cores) each is also trained on sums modulo 10 for cumsum's epochs: the test
exact match, and the step by which the training loss has left that plateau (the end of the first 200-step
window whose mean is below 1.5). Variants:

- untied: tie_embeddings false;
- tied: the default, one matrix for the source, the target and the output layer;
- copy-start: untied, but the output layer starts as a copy of the decoder's input vectors (the tied
  model's start without its shared gradient).

Run from the repository root:
    PYTHONPATH=. python benchmarks/length_study/tie_start.py [--seeds 0 1 2 3] [--train]
"""

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lib.evaluate import evaluation
from lib.evaluate.evaluation import EvaluatePaths
from lib.model import setup
from lib.tasks.writing import run_tokenize
from lib.train import training
from lib.core.text import load_params
from lib.train.curves import read_curves
from lib.tasks.params import stage_config
from lib.model.setup import repeats_input
from lib.train.families import TRAINING
from lib.tasks.writing import run_prepare
from lib.data.tokenizer import SpecialIds
from transformer.masks import padding_mask, target_mask
from transformer.model import build_model
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("untied", "tied", "copy-start")
PLATEAU_EXIT, WINDOW = 1.5, 200  # below the plateau's 2.2, far above the floor's 0.57


def cumsum_params(variant: str, seed: int) -> dict:
    """params.yaml with cumsum's sums modulo 10, dropout 0, and the variant's tie."""
    params = load_params(ROOT / "params.yaml")
    cumsum = params["cumsum"]
    cumsum["prepare"]["modulus"] = 10
    cumsum["train"]["seed"] = seed
    cumsum["train"]["model"].update(dropout=0.0, activation_dropout=0.0, tie_embeddings=variant == "tied")
    return params


def build(variant: str):
    """``build_model`` for the variant: copy-start copies the decoder's input vectors into the output layer."""
    def make(cfg, kind, src_vocab_size, tgt_vocab_size, joint_vocab, fast=False):
        model = build_model(cfg, kind, src_vocab_size, tgt_vocab_size, joint_vocab, fast)
        if variant == "copy-start":
            with torch.no_grad():
                model.generator.weight.copy_(model.tgt_embed.tokens.weight)
        return model
    return make


def untrained(variant: str, seed: int, vocab_size: int = 14, batch: int = 256, length: int = 10) -> dict:
    """The untrained model: how often it predicts the token it was given (as the train stage records it),
    and its loss on random digits (ids 4-13: the tokenizer's four special ids come first)."""
    cfg = stage_config(cumsum_params(variant, seed), "cumsum", "train")
    torch.manual_seed(seed)
    model = build(variant)(cfg.model, "seq2seq", vocab_size, vocab_size, True).eval()
    src, tgt_in, tgt_out = (torch.randint(4, vocab_size, (batch, length)) for _ in range(3))
    with torch.no_grad():
        logits = model(src, tgt_in, padding_mask(src, 0), target_mask(tgt_in, 0))
    repeats = repeats_input(model, SpecialIds(pad=0, bos=1, eos=2, unk=3), TRAINING["seq2seq"].logits)
    return {"repeats_input": round(repeats, 3),
            "first_loss": round(F.cross_entropy(logits.reshape(-1, vocab_size), tgt_out.reshape(-1)).item(), 3)}


def plateau_exit(live_dir: Path) -> int | None:
    """The end of the first WINDOW-step window whose mean training loss is below PLATEAU_EXIT; None: never."""
    loss = read_curves(live_dir)["train/loss"]
    means = loss.groupby(loss.step // WINDOW).value.mean()
    below = means[means < PLATEAU_EXIT]
    return None if below.empty else int(below.index[0] + 1) * WINDOW


def trained(variant: str, seed: int, tmp: Path) -> dict:
    params = cumsum_params(variant, seed)
    data, tok, run_dir = tmp / "data", tmp / "tok", tmp / f"{variant}-{seed}"
    if not data.exists():  # the same data and vocabulary for every run
        run_prepare("cumsum", stage_config(params, "cumsum", "prepare"), data)
        run_tokenize("cumsum", stage_config(params, "cumsum", "tokenize"), data, tok)
    setup.build_model = build(variant)
    start = time.perf_counter()
    training.run("cumsum", stage_config(params, "cumsum", "train"), data, tok, run_dir / "model.pt",
                 run_dir / "ckpt", run_dir / "live")
    seconds = time.perf_counter() - start
    metrics = evaluation.run("cumsum", stage_config(params, "cumsum", "evaluate"), EvaluatePaths(
        data=data, tokenizer=tok, model=run_dir / "model.pt", metrics=run_dir / "metrics.json", samples=run_dir /
        "samples.jsonl"))
    return {"train_s": round(seconds), "exact_match": metrics["greedy"]["exact_match"],
            "plateau_left_by_step": plateau_exit(run_dir / "live")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--train", action="store_true", help="also train each on sums modulo 10 (~50 s a run)")
    args = parser.parse_args()
    results = {variant: {seed: untrained(variant, seed) for seed in args.seeds} for variant in args.variants}
    if args.train:
        with tempfile.TemporaryDirectory() as tmp:
            for variant in args.variants:
                for seed in args.seeds:
                    results[variant][seed].update(trained(variant, seed, Path(tmp)))
    print(json.dumps({**header("tie_start"), "ln_V": round(math.log(14), 3), "results": results}, indent=2))


if __name__ == "__main__":
    main()
