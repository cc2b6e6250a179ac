"""Training tokens per second: the hand-written Transformer against torch.nn.Transformer.

Both models get the same sizes (default: d_model 256, 8 heads, 3+3 layers,
feed-forward 1024, dropout 0.1 in the same places: embeddings, residual
branches, attention weights and the feed-forward's activation), the same
batches (multi30k token-budget batches when data/multi30k exists, else random
tokens of 64 x 24 + 24), the same optimizer (fused Adam, betas 0.9/0.98, as
the train stage) and the same label smoothing, each with its own idiomatic
loss. They are timed alternately, round after round, in one process, so that
a noisy machine slows both alike.
Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/throughput/train_throughput.py [--precision fp32|bf16] [--rounds 4] [--steps 10]
        [--device cpu|cuda] [--compile] [--data DIR --tokenizer DIR] [--max-tokens 2048 [4096 ...]]
Prints one JSON object (a line) per --max-tokens; tokens are the non-pad source plus target tokens.
"warmup_round_s" is the untimed first round's seconds: with --compile, mostly the compiling.
MFU: the model's matmul FLOPs per second (lib.model.hardware.training_flops, on the
real lengths) over this machine's measured matmul peak in the same precision
(square products of 1024 and 2048 on a CPU, 4096 and 8192 on a GPU, in the
three layouts of a training step's products, best of several; 256 on a CPU
without a bfloat16 kernel of its own, whose ~1 GFLOP/s would take minutes on
the larger ones: lib.model.hardware.square_sizes), measured again after every round:
"mfu" is the fastest round over the highest peak. A shared machine's speed
drifts by tens of percent within seconds, and the extremes of two noisy series
rarely fall together, so "mfu_paired" also times every step against one of the
larger products in each layout, run right after it: the median over the steps
of the step's rate over that peak.
On a GPU every timing waits for the device to finish its queued work.
--profile N adds where a step's time goes: N more steps of each model under
torch.profiler, its operators' own time (a GPU's kernels, else the CPU's)
summed by kind (matmul, softmax, norm, dropout, cast and copy, optimizer,
other) and the costliest operators (and, on a GPU, kernels), in ms a step;
"ops_per_step" counts the operator calls that took time (on a GPU, those that
launched a kernel); "matmul_tflops" is the products' own rate (their FLOPs over
their time), and "top_matmuls" the costliest by shape: [operator, input shapes,
calls, ms, TFLOP/s] a step, from a second pass over the same steps that records
shapes (``profile`` says why the times come from the first). The profiler slows
the host: "step_ms" there is the profiled step's.
"""

import argparse
import json
import math
import resource
import statistics
from functools import partial
from itertools import cycle, islice
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lib.data.pairs import Batch, Pairs, collate, read_split, token_budget_batches
from lib.model.device import keep_freed_memory
from lib.model.losses import seq2seq_loss
from lib.model.hardware import LAYOUTS, PRECISION_DTYPES, clock, matmul_peak, product_rate, square_sizes, training_flops
from lib.data.tokenizer import SpecialIds, encode_pairs, load_tokenizers, special_ids
from transformer.config import ModelConfig
from transformer.fast.compile import compile_model
from transformer.model import build_model
from transformer.positions import SinusoidalPositionalEncoding
from benchmarks.throughput.step_profile import profile_or_why
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("ours", "torch_nn_transformer")


class TorchReference(nn.Module):
    """torch.nn.Transformer with the embeddings, positions and tied generator ours has (never used by lib/)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.positions = SinusoidalPositionalEncoding(cfg.d_model, cfg.max_len)  # a fixed table, no parameters
        self.dropout = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.encoder_layers, cfg.decoder_layers,
                                          cfg.d_ff, cfg.dropout, batch_first=True)
        self.generator = nn.Linear(cfg.d_model, vocab_size)
        self.generator.weight = self.embed.weight
        self.scale = math.sqrt(cfg.d_model)

    def forward(self, src, tgt, pad_id):
        embed = lambda ids: self.dropout(self.positions(self.embed(ids) * self.scale))  # noqa: E731 - a one-line helper, named where it is used
        # True: may not attend
        causal = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=tgt.device).triu(1)
        hidden = self.transformer(embed(src), embed(tgt), tgt_mask=causal, tgt_is_causal=True,
                                  src_key_padding_mask=src == pad_id, tgt_key_padding_mask=tgt == pad_id,
                                  memory_key_padding_mask=src == pad_id)
        return self.generator(hidden)


def ours_loss(model, batch: Batch, ids: SpecialIds, smoothing: float, compiled: bool = False):
    loss, n = seq2seq_loss(model, batch, ids, smoothing, compiled=compiled)  # the train stage's own loss
    return loss / n


def torch_loss(model, batch: Batch, ids: SpecialIds, smoothing: float):
    logits = model(batch.src, batch.tgt_in, ids.pad)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), batch.tgt_out.reshape(-1),
                           ignore_index=ids.pad, label_smoothing=smoothing)


WMT_TOKENS, WMT_SIGMA = 30.0, 0.6  # a WMT14 sentence's BPE tokens: log-normal, mean about 23 words' worth


def wmt_like(n: int, vocab_size: int, ids: SpecialIds):
    """A function of a token budget that gives n batches of random ids as WMT14's are shaped (lengths log-normal
    around 30 tokens with a long tail, at most 256; a target about as long as its source), each of about that
    many real tokens a side (train.batch_unit real, the wmt14 recipe's)."""
    g = torch.Generator().manual_seed(0)

    def batches(max_tokens: int) -> list[Batch]:
        count = n * max_tokens // int(WMT_TOKENS) + 100
        lengths = torch.empty(count, 2).log_normal_(math.log(WMT_TOKENS) - WMT_SIGMA ** 2 / 2, WMT_SIGMA, generator=g)
        lengths = lengths.round().clamp(1, 255).long().tolist()
        pairs = Pairs(*([torch.randint(4, vocab_size, (length[side],), generator=g).tolist() for length in lengths]
                        for side in (0, 1)))
        return [collate(pairs, b, ids) for b in token_budget_batches(pairs, max_tokens, g, "real")[:n]]
    return batches


def batch_source(data: Path, tok: Path, n: int, synthetic_vocab: int = 0):
    """A function of a token budget that gives n multi30k training batches if the pipeline has built them,
    else random 64 x 24 + 24 batches (or, with ``synthetic_vocab``, WMT14-like ones: ``wmt_like``); the special
    ids, the vocabulary size and which batches they are."""
    if synthetic_vocab:
        ids = SpecialIds(pad=0, bos=1, eos=2, unk=3)
        return wmt_like(n, synthetic_vocab, ids), ids, synthetic_vocab, f"WMT14-like lengths, {synthetic_vocab} ids"
    if (data / "train.parquet").is_file() and tok.is_dir():
        tokenizers = load_tokenizers(tok)
        ids = special_ids(tokenizers)
        pairs = encode_pairs(tokenizers, read_split(data, "train"))

        def multi30k(max_tokens: int) -> list[Batch]:
            order = token_budget_batches(pairs, max_tokens, torch.Generator().manual_seed(0))[:n]
            return [collate(pairs, b, ids) for b in order]
        return multi30k, ids, tokenizers.target.get_vocab_size(), "multi30k"
    ids, V = SpecialIds(pad=0, bos=1, eos=2, unk=3), 8000
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(n):
        src, tgt = torch.randint(4, V, (64, 24), generator=g), torch.randint(4, V, (64, 24), generator=g)
        batches.append(Batch(src, torch.cat([torch.full((64, 1), ids.bos), tgt[:, :-1]], 1), tgt, tgt.numel()))
    return lambda max_tokens: batches, ids, V, "random 64 x 24 + 24"  # the same batches at every budget


def train_step(model, loss_fn, optimizer, batch: Batch, ids: SpecialIds, precision: str):
    """One step as the train stage takes it: forward and loss under autocast, backward, clip, Adam."""
    with torch.autocast(batch.src.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = loss_fn(model, batch, ids, 0.1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def checked(kind, holds, what: str):
    """An argparse type: a number of ``kind`` for which ``holds``, else an error that says it must be ``what``
    (a count or rate of 0 divided by zero after the work)."""
    def parse(text: str):
        value = kind(text)
        if not holds(value):
            raise argparse.ArgumentTypeError(f"{text}: must be {what}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its message
    return parse


def positive(kind):
    return checked(kind, lambda value: value > 0, "above 0")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--activation-dropout", type=float, default=None,
                        help="ours only, on the feed-forward's activation (default: --dropout, as torch's layer has)")
    parser.add_argument("--max-tokens", type=positive(int), nargs="+", default=[2048],
                        help="token budget of a multi30k batch; several: one measurement (a JSON line) each")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--steps", type=positive(int), default=10, help="batches per model per round")
    parser.add_argument("--rounds", type=positive(int), default=4, help="timed rounds, after one warm-up round")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="which to time (default both, alternately)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the models' forward passes, and ours' loss, as train.compile does "
                             "(the warm-up round compiles them)")
    parser.add_argument("--profile", type=checked(int, lambda n: n >= 0, "0 or more"), default=0, metavar="N",
                        help="then N steps of each model under torch.profiler: where a step's time goes")
    parser.add_argument("--synthetic-vocab", type=checked(int, lambda n: n >= 0, "0 or more"), default=0,
                        metavar="V", help="random ids of WMT14-like lengths from a V-token vocabulary, batched by "
                        "real tokens, in place of multi30k's batches (0: multi30k's)")
    parser.add_argument("--square", type=checked(int, lambda n: n >= 0, "0 or more"), default=0, metavar="N",
                        help="the peak from N x N products alone (a dry run's: small and quick); 0: the sizes "
                             "that reach the device's peak")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "multi30k", help="the prepared multi30k data")
    parser.add_argument("--tokenizer", type=Path, default=ROOT / "models" / "multi30k" / "tokenizer")
    return parser.parse_args()


# What a JSON line says of the model.
MODEL_KEYS = ("d_model", "n_heads", "encoder_layers", "decoder_layers", "d_ff", "dropout", "activation_dropout")


def model_config(args: argparse.Namespace) -> ModelConfig:
    """The paper's base layout at the sizes given: Post-LN, tied embeddings, fused projections."""
    return ModelConfig(d_model=args.d_model, n_heads=args.heads, encoder_layers=args.layers,
                       decoder_layers=args.layers, d_ff=args.d_ff, dropout=args.dropout, norm_first=False,
                       tie_embeddings=True, fused_qkv=True, max_len=256,
                       activation_dropout=args.dropout if args.activation_dropout is None else args.activation_dropout)


def batch_work(cfg: ModelConfig, V: int, batch: Batch, ids: SpecialIds) -> tuple[int, float]:
    """A batch's tokens (non-pad source and target) and its training FLOPs, on its real (unpadded) lengths."""
    src_lengths, tgt_lengths = (batch.src != ids.pad).sum(1).tolist(), (batch.tgt_out != ids.pad).sum(1).tolist()
    return sum(src_lengths) + sum(tgt_lengths), training_flops(cfg, V, src_lengths, tgt_lengths)


def measure(args: argparse.Namespace, cfg: ModelConfig, batches: list[Batch], ids: SpecialIds, V: int) -> dict:
    """The models (--models), new from seed 0, trained on ``batches`` round after round: the figures of one
    JSON line."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    built = {"ours": lambda: (build_model(cfg, "seq2seq", V, V, joint_vocab=True, fast=True).to(device),
                              partial(ours_loss, compiled=args.compile)),
             "torch_nn_transformer": lambda: (TorchReference(cfg, V).to(device), torch_loss)}
    models = {name: build() for name, build in built.items() if name in args.models}
    if args.compile:  # as the train stage does: one graph for the batches' varying shapes (ours' loss: above)
        models = {name: (compile_model(m, "seq2seq"), loss) for name, (m, loss) in models.items()}
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
                  for name, (m, _) in models.items()}
    work = [batch_work(cfg, V, b, ids) for b in batches]
    tokens, batch_flops = sum(n for n, _ in work), [f for _, f in work]
    flops = sum(batch_flops)
    batches = [b.to(device) for b in batches]
    dtype = PRECISION_DTYPES[args.precision]
    sizes = (args.square,) if args.square else square_sizes(device, dtype)
    n = sizes[-1]
    square = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    rounds, peaks, paired = {name: [] for name in models}, [], {name: [] for name in models}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        round_seconds = {}
        for name, (model, loss_fn) in models.items():
            model.train()
            round_seconds[name] = 0.0
            for batch, step_flops in zip(batches, batch_flops):
                start = clock(device)
                train_step(model, loss_fn, optimizers[name], batch, ids, args.precision)
                seconds = clock(device) - start
                round_seconds[name] += seconds
                if round_:
                    peak_now = max(product_rate(*layout(*square)) for layout in LAYOUTS)  # right after the step
                    paired[name].append(step_flops / seconds / peak_now)
        peak = matmul_peak(dtype, device, repeats=3, sizes=sizes)
        if round_:
            peaks.append(peak)
            for name, s in round_seconds.items():
                rounds[name].append(s)
        else:
            warmup = round_seconds
    profiles = {name: profile_or_why([partial(train_step, model, loss_fn, optimizers[name], batch, ids, args.precision)
                                      for batch in islice(cycle(batches), args.profile)], device)
                for name, (model, loss_fn) in models.items()} if args.profile else None
    seconds = {name: sum(values) for name, values in rounds.items()}
    rate = {name: tokens * args.rounds / s for name, s in seconds.items()}
    return {
        "tokens_per_step": round(tokens / len(batches)),
        "tokens_per_s": {name: round(r) for name, r in rate.items()},
        "ms_per_step": {name: round(s / (args.rounds * len(batches)) * 1000, 1) for name, s in seconds.items()},
        **({"ratio_ours_over_torch": round(rate["ours"] / rate["torch_nn_transformer"], 3)} if len(rate) == 2 else {}),
        "round_s": {name: [round(s, 2) for s in values] for name, values in rounds.items()},
        "warmup_round_s": {name: round(s, 2) for name, s in warmup.items()},  # with --compile, mostly compiling
        "matmul_peak_gflops": [round(p / 1e9, 1) for p in peaks],
        "mfu": {name: round(flops / min(values) / max(peaks), 3) for name, values in rounds.items()},
        "mfu_paired": {name: round(statistics.median(values), 3) for name, values in paired.items()},
        "peak_memory_gb": peak_memory_gb(device),
        **({"profile": profiles} if profiles else {}),
    }


def peak_memory_gb(device: torch.device) -> float:
    """The most memory the run held: the GPU's allocated tensors, or the process's resident set on a CPU."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)  # Linux: kilobytes


def main():
    args = parse_args()
    device = torch.device(args.device)
    keep_freed_memory()  # as the train stage does on a CPU; process-wide, so for both models
    cfg = model_config(args)
    batches_at, ids, V, source = batch_source(args.data, args.tokenizer, args.steps, args.synthetic_vocab)
    for max_tokens in args.max_tokens:
        print(json.dumps({
            **header("train_throughput"), "batches": source,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": args.precision, "compile": args.compile,
            "model": {k: getattr(cfg, k) for k in MODEL_KEYS},
            "max_tokens": max_tokens, **measure(args, cfg, batches_at(max_tokens), ids, V),
        }), flush=True)

if __name__ == "__main__":
    main()
