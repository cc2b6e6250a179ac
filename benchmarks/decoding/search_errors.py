"""Search errors or model errors? Beam search's best output against the reference, both scored by the model.

Needs a trained translation model (multi30k's by default; --data and
--models for another task's). For each beam size, every sentence of the split
is decoded and its best output's score (log-probability over GNMT's length
penalty, as beam search ranks) compared with the reference's, scored the same
way by teacher forcing (``transformer.greedy.score_outputs``; what
``lib.use.generate --score`` writes):

- search error: the reference scores higher: the model prefers it, the search missed it;
- model error: the reference scores lower and differs from the output: the model prefers its own output;
- exact: the output is the reference, token for token.

It also counts the sentences whose empty output (``<eos>`` alone) scores above
the beam's best, at alpha 0 (raw log-probability) and at the alpha given: the
short-output bias the length penalty is there for. Run from the repository root:
    PYTHONPATH=. python benchmarks/decoding/search_errors.py [--split valid] [--beam-sizes 1 5 20] [--alpha 1.5]
"""

import argparse
import json
from pathlib import Path

from lib.model.checkpoint import load_directory
from lib.core.text import load_params
from lib.data.pairs import read_split
from lib.evaluate.decode import score_outputs, translate_n_best
from lib.evaluate.evaluation import search_or_model
from lib.data.tokenizer import encode_pairs, special_ids
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "data" / "multi30k"))
    parser.add_argument("--models", default=str(ROOT / "models" / "multi30k"))
    parser.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5, 20])
    tuned = load_params(ROOT / "params.yaml")["multi30k"]["evaluate"]["alpha"]
    parser.add_argument("--alpha", type=float, default=tuned,
                        help="beam search's length penalty (default: params.yaml's multi30k.evaluate.alpha)")
    parser.add_argument("--max-tokens", type=int, default=8192)
    args = parser.parse_args()

    model, tokenizers, _ = load_directory(args.models, option="--models")
    ids = special_ids(tokenizers)
    pairs = encode_pairs(tokenizers, read_split(args.data, args.split))
    n = len(pairs.src)
    scored = score_outputs(model, pairs.src, pairs.tgt, ids, args.max_tokens)
    empty_scored = score_outputs(model, pairs.src, [[] for _ in range(n)], ids, args.max_tokens)  # <eos> alone
    references = {alpha: [h.with_alpha(alpha) for h in scored] for alpha in (0.0, args.alpha)}
    empty = {alpha: [h.with_alpha(alpha) for h in empty_scored] for alpha in (0.0, args.alpha)}
    results = {}
    for beam_size in args.beam_sizes:
        row = {}
        for alpha in sorted({0.0, args.alpha}):
            best = [h[0] for h in translate_n_best(model, pairs.src, ids, args.max_tokens, 20, beam_size, alpha)]
            row[f"alpha={alpha}"] = {
                "exact": round(sum(b.tokens == t for b, t in zip(best, pairs.tgt)) / n, 4),
                **{k: round(v, 4) for k, v in search_or_model(best, references[alpha]).items()},
                "empty_beats_best": round(sum(m.score > b.score for m, b in zip(empty[alpha], best)) / n, 4),
                "mean_best_score": round(sum(b.score for b in best) / n, 4),
                "mean_best_tokens": round(sum(len(b.tokens) + b.eos for b in best) / n, 2),
            }
        results[f"beam={beam_size}"] = row
    print(json.dumps({**header("search_errors"), "split": args.split,
                      "sentences": n, "alpha": args.alpha,
                      "mean_reference_score": {f"alpha={a}": round(sum(r.score for r in references[a]) / n, 4)
                                               for a in sorted(references)},
                      "mean_reference_tokens": round(sum(len(t) + 1 for t in pairs.tgt) / n, 2),
                      "results": results}))


if __name__ == "__main__":
    main()
