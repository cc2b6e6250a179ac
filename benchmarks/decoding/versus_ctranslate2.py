"""Our decoding against CTranslate2's on the same trained weights and sentences, in one run.

Needs a trained translation model (multi30k's by default). The model is exported
to CTranslate2 (``lib.use.to_ctranslate2``) into a scratch directory; then each
engine decodes the whole split, greedy and beam search, on the same number of
threads, best of ``--rounds`` runs each, the engines in turn. CTranslate2 runs
as a user calls it (one call, batches of ``--max-tokens`` tokens), in fp32 and
in int8. Ours runs as the evaluate stage does, with no length penalty (the
search CTranslate2 runs too) and with ``--alpha`` (the evaluate stage's).
``--before TREE`` also runs ours from another checkout (the commit before a
change), in a process of its own, in the same run. Prints one JSON object:
sentences a second, seconds, BLEU, and ours over CTranslate2 fp32.
Run from the repository root:
    PYTHONPATH=. python benchmarks/decoding/versus_ctranslate2.py [--threads 2] [--before /tmp/before]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lib.core.text import load_params
from lib.data.pairs import read_split
from lib.data.tokenizer import decode, encode_pairs, load_tokenizers, special_ids
from lib.evaluate.decode import translate
from lib.model.checkpoint import load_directory
from lib.tasks import translation
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]


def timed(run, rounds: int) -> tuple[float, list]:
    """The fastest of ``rounds`` runs of ``run()``, in seconds, and its outputs (the same every round)."""
    best, outputs = float("inf"), None
    for _ in range(rounds):
        start = time.perf_counter()
        outputs = run()
        best = min(best, time.perf_counter() - start)
    return best, outputs


def ours(args, searches: dict) -> dict:
    """Our searches on this tree's code: {name: (seconds, outputs)}."""
    model, tokenizers, _ = load_directory(args.models, option="--models")
    ids = special_ids(tokenizers)
    sources = encode_pairs(tokenizers, read_split(args.data, args.split)).src
    found = {}
    for name, (beam, alpha) in searches.items():
        seconds, outputs = timed(lambda: translate(model, sources, ids, args.max_tokens, args.max_extra_tokens,
                                                   beam, alpha), args.rounds)
        found[name] = {"seconds": seconds, "text": decode(tokenizers.target, outputs)}
    return found


def theirs(args, searches: dict) -> dict:
    """CTranslate2's searches on the exported weights, fp32 and int8: {name: (seconds, outputs)}."""
    import ctranslate2

    from lib.use import to_ctranslate2

    tokenizers = load_tokenizers(Path(args.models) / "tokenizer")  # the model itself: CTranslate2's copy
    test = read_split(args.data, args.split)
    sources = [[tokenizers.source.id_to_token(i) for i in s] for s in encode_pairs(tokenizers, test).src]
    found = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "ct2"
        to_ctranslate2.export(args.task, Path(args.models), out, alpha=0.0)
        options = json.loads((out / to_ctranslate2.OPTIONS_FILE).read_text())
        for compute_type in ("float32", "int8"):
            translator = ctranslate2.Translator(str(out), device="cpu", compute_type=compute_type, inter_threads=1,
                                                intra_threads=args.threads)
            for name, (beam, alpha) in searches.items():
                if alpha:
                    continue  # no GNMT penalty there
                run_options = {**options, "translate_batch": {**options["translate_batch"], "beam_size": max(beam, 1)}}
                seconds, outputs = timed(lambda: to_ctranslate2.translate(
                    translator, sources, run_options, args.max_tokens, exact_limits=False), args.rounds)
                text = [tokenizers.target.decode([tokenizers.target.token_to_id(t) for t in tokens])
                        for tokens in outputs]
                found[f"{name} {compute_type}"] = {"seconds": seconds, "text": text}
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="multi30k")
    parser.add_argument("--data", default=str(ROOT / "data" / "multi30k"))
    parser.add_argument("--models", default=str(ROOT / "models" / "multi30k"))
    parser.add_argument("--split", default="test", choices=["train", "valid", "test"])
    parser.add_argument("--beam-size", type=int, default=5)
    tuned = load_params(ROOT / "params.yaml")["multi30k"]["evaluate"]["alpha"]
    parser.add_argument("--alpha", type=float, default=tuned, help="ours' length penalty beside none (default: "
                        "params.yaml's multi30k.evaluate.alpha)")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--max-extra-tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", type=Path, help="another checkout whose decoding runs as ours' 'before'")
    parser.add_argument("--engines", default="ours,ctranslate2", help=argparse.SUPPRESS)  # --before's process
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.data, args.models = str(Path(args.data).resolve()), str(Path(args.models).resolve())  # for --before's cwd
    torch.set_num_threads(args.threads)
    searches = {"greedy": (0, 0.0), f"beam{args.beam_size}": (args.beam_size, 0.0),
                f"beam{args.beam_size} alpha={args.alpha}": (args.beam_size, args.alpha)}
    engines = args.engines.split(",")
    runs = {}
    if "ours" in engines:
        runs["ours"] = ours(args, searches)
    if args.before:  # the same script, the other tree's lib on the path
        with tempfile.NamedTemporaryFile(suffix=".json") as file:
            command = [sys.executable, str(Path(__file__).resolve()), "--engines", "ours", "--json-out", file.name,
                       *[f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                         if k in ("task", "data", "models", "split", "beam_size", "alpha", "max_tokens",
                                  "max_extra_tokens", "threads", "rounds")]]
            subprocess.run(command, cwd=args.before, env={"PYTHONPATH": str(args.before), "PATH": "/usr/bin:/bin"},
                           check=True)
            runs["before"] = json.loads(Path(file.name).read_text())
    if "ctranslate2" in engines:
        runs["ctranslate2"] = theirs(args, searches)
    if args.json_out:
        args.json_out.write_text(json.dumps(runs["ours"]))
        return
    references = read_split(args.data, args.split)["tgt"].tolist()
    n = len(references)
    table = {engine: {name: {"sentences_per_s": round(n / r["seconds"], 1), "seconds": round(r["seconds"], 2),
                             "bleu": round(translation.score(r["text"], references)["bleu"], 2)}
                      for name, r in found.items()} for engine, found in runs.items()}
    ratios = {name: round(table["ours"][name]["sentences_per_s"] / table["ctranslate2"][f"{name} float32"]
                          ["sentences_per_s"], 3)
              for name in table.get("ours", {}) if f"{name} float32" in table.get("ctranslate2", {})}
    same = {name: sum(a == b for a, b in zip(runs["ours"][name]["text"], runs["ctranslate2"][f"{name} float32"]
                                                 ["text"])) / n
            for name in ratios}
    print(json.dumps({**header("versus_ctranslate2"), "split": args.split, "sentences": n, "threads": args.threads,
                      "rounds": args.rounds, **table, "ours_over_ctranslate2_fp32": ratios,
                      "same_outputs_as_ctranslate2_fp32": same}))


if __name__ == "__main__":
    main()
