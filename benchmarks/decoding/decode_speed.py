"""Decoding speed with and without the key/value cache, greedy and beam search, on the multi30k test set.

Needs the trained multi30k model (`dvc repro` with multi30k in `tasks`). Each
search runs cached and uncached in the same process, one after the other, on
the same batches; outputs must be identical, and the BLEU of each is printed.
Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/decoding/decode_speed.py [--beam-size 5] [--alpha 0.6]
Prints one JSON object.
"""

import argparse
import json
import time
from pathlib import Path


from lib.model.checkpoint import load_directory
from lib.data.pairs import read_split
from lib.evaluate.decode import translate
from lib.tasks import translation
from lib.data.tokenizer import decode, encode_pairs, special_ids
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "data" / "multi30k"))
    parser.add_argument("--models", default=str(ROOT / "models" / "multi30k"))
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--max-extra-tokens", type=int, default=20)
    args = parser.parse_args()

    model, tokenizers, _ = load_directory(args.models, option="--models")
    ids = special_ids(tokenizers)
    test = read_split(args.data, "test")
    sources = encode_pairs(tokenizers, test).src
    references = test["tgt"].tolist()
    results = {}
    for name, beam in (("greedy", 0), (f"beam{args.beam_size}", args.beam_size)):
        runs = {}
        for cached in (True, False):
            start = time.perf_counter()
            outputs = translate(model, sources, ids, args.max_tokens, args.max_extra_tokens, beam, args.alpha,
                                use_cache=cached)
            seconds = time.perf_counter() - start
            runs["cached" if cached else "uncached"] = {
                "seconds": round(seconds, 2), "sentences_per_s": round(len(sources) / seconds, 1),
                "bleu": round(translation.score(decode(tokenizers.target, outputs), references)["bleu"], 2),
                "outputs": outputs}
        identical = runs["cached"].pop("outputs") == runs["uncached"].pop("outputs")
        results[name] = {**runs, "speedup": round(runs["uncached"]["seconds"] / runs["cached"]["seconds"], 2),
                         "identical_outputs": identical}
    print(json.dumps({**header("decode_speed"), "sentences": len(sources), "alpha": args.alpha, **results}))


if __name__ == "__main__":
    main()
