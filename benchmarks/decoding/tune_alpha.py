"""Choose beam search's length penalty on the validation split (never the test split).

Needs the trained multi30k model. Decodes the 1,014 validation sentences with
beam search once per alpha and prints the BLEU of each; put the best in
params.yaml: multi30k.evaluate.alpha. Run from the repository root:
    PYTHONPATH=. python benchmarks/decoding/tune_alpha.py [--beam-size 5] [--alphas 0 0.3 0.6 0.9 1.2]
"""

import argparse
import json
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
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.3, 0.6, 0.9, 1.2])
    args = parser.parse_args()

    model, tokenizers, _ = load_directory(args.models, option="--models")
    ids = special_ids(tokenizers)
    valid = read_split(args.data, "valid")
    sources = encode_pairs(tokenizers, valid).src
    bleu = {"greedy": translation.score(decode(tokenizers.target, translate(model, sources, ids, 8192, 20)),
                                     valid["tgt"].tolist())["bleu"]}
    for alpha in args.alphas:
        outputs = translate(model, sources, ids, 8192, 20, args.beam_size, alpha)
        bleu[f"alpha={alpha}"] = translation.score(decode(tokenizers.target, outputs), valid["tgt"].tolist())["bleu"]
    print(json.dumps({**header("tune_alpha"), "split": "valid",
                      "beam_size": args.beam_size, "bleu": {k: round(v, 2) for k, v in bleu.items()}}))


if __name__ == "__main__":
    main()
