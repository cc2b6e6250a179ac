"""What the embedding's id check (``transformer.layers.Embedding.check_ids``) costs where it costs most: small steps.

Decodes the cumsum test set with the trained cumsum model, greedily and with
beam search (one token a step through a 0.18M-parameter model, so the check's
pass over the ids weighs the most it can), and runs training steps of that
model on its own batches, each with the check and with it switched off, in
alternating rounds in one process; outputs must be identical. Needs `dvc
repro` (the default cumsum task). Run from the repository root:
    PYTHONPATH=. python benchmarks/throughput/id_check_cost.py [--rounds 5] [--beam-size 4]
Prints one JSON object: the best of the rounds' seconds, each way, and the ratio; and the microseconds one check
takes on the ids of a decoding step (B, 1) and of a training batch (B, T).
"""

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch

from lib.data.pairs import collate, read_split, token_budget_batches
from lib.use.inference import load
from transformer.masks import padding_mask, target_mask
from transformer.layers import Embedding
from lib.data.tokenizer import encode_pairs, special_ids
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]


def timed(work) -> tuple[float, object]:
    start = time.perf_counter()
    result = work()
    return time.perf_counter() - start, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beam-size", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    translator = load(ROOT / "models" / "cumsum")
    sources = read_split(ROOT / "data" / "cumsum", "test").src
    pairs = encode_pairs(translator.tokenizers, read_split(ROOT / "data" / "cumsum", "train"))
    ids = special_ids(translator.tokenizers)
    batches = [collate(pairs, batch, ids) for batch in token_budget_batches(pairs, 1024)[:100]]
    model, pad = translator.model, ids.pad

    def train_steps() -> list[float]:  # forward and backward, the losses (the same dropout masks each time)
        torch.manual_seed(0)
        model.train()
        losses = []
        for b in batches:
            logits = model(b.src, b.tgt_in, padding_mask(b.src, pad), target_mask(b.tgt_in, pad))
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=pad)
            loss.backward()
            losses.append(loss.item())
        model.eval()
        return losses

    work = {"greedy": lambda: translator.translate(sources),
            f"beam{args.beam_size}": lambda: translator.translate(sources, beam_size=args.beam_size),
            "train_100_steps": train_steps}
    check, seconds, outputs, calls = Embedding.check_ids, {}, {}, Counter()  # calls: of check_ids, a run
    for name, run in work.items():
        for i in range(args.rounds):  # each way in turn, the first of a round alternating: no order favoured
            for checked in ((True, False) if i % 2 == 0 else (False, True)):
                Embedding.check_ids = check if checked else lambda self, ids, start: calls.update([name])
                took, outputs[name, checked] = timed(run)
                seconds.setdefault((name, checked), []).append(took)
    Embedding.check_ids = check
    embed, repeats = model.src_embed, 10_000
    per_call = {}  # microseconds a call, on ids of a decoding step (B, 1) and of training batches (B, T)
    for shape in [(1, 1), (256, 1), (64, 16), (64, 256)]:
        ids = torch.randint(0, embed.tokens.num_embeddings, shape)
        took = timed(lambda: [check(embed, ids, 0) for _ in range(repeats)])[0]
        per_call["x".join(map(str, shape))] = round(1e6 * took / repeats, 2)
    print(json.dumps({**header("id_check_cost"),
                      "sentences": len(sources), "train_batches": len(batches), "check_ids_us": per_call, **{
                          name: {"checked_s": round(min(seconds[name, True]), 3),
                                 "unchecked_s": round(min(seconds[name, False]), 3),
                                 "ratio": round(min(seconds[name, True]) / min(seconds[name, False]), 3),
                                 "identical_outputs": outputs[name, True] == outputs[name, False],
                                 "checks_a_run": calls[name] // args.rounds}
                          for name in work}}))


if __name__ == "__main__":
    main()
