"""Our model against its `transformers` export (``--format transformers``: a MarianMT model) on a whole split.

Needs a trained translation model (multi30k's by default). The model is exported into a scratch directory and
loaded with ``AutoModelForSeq2SeqLM`` and ``AutoTokenizer``. Both then read the same split: the teacher-forced
logits of every reference (their largest difference), and greedy search, each sentence allowed its length +
``--max-extra-tokens`` tokens as the evaluate stage allows (``generate`` takes one ``max_new_tokens`` a call,
so sentences of one length go together). Prints one JSON object: the largest logit difference, how many
greedy outputs are the same, and the BLEU of each. Run from the repository root:
    PYTHONPATH=. python benchmarks/decoding/versus_transformers.py [--models DIR --data DIR]
"""

import argparse
import json
import tempfile
from pathlib import Path

import torch

from lib.data.pairs import read_split
from lib.data.tokenizer import decode, encode_pairs, special_ids
from lib.evaluate.decode import translate
from lib.model.checkpoint import load_directory
from lib.tasks import translation
from lib.use import to_transformers
from lib.use.families import USES
from tools.results import header
from transformer.masks import padding_mask, target_mask

ROOT = Path(__file__).resolve().parents[2]


@torch.no_grad()
def largest_logit_difference(model, hf, test, ids, batch: int = 100) -> float:
    """Over every real target position of the split, teacher-forced, batch by batch."""
    largest = 0.0
    for start in range(0, len(test.src), batch):
        sources, targets = test.src[start:start + batch], test.tgt[start:start + batch]
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in sources], True, ids.pad)
        tgt = torch.nn.utils.rnn.pad_sequence([torch.tensor([ids.bos] + t) for t in targets], True, ids.pad)
        ours = model(src, tgt, padding_mask(src, ids.pad), target_mask(tgt, ids.pad))
        theirs = hf(input_ids=src, attention_mask=(src != ids.pad).long(), decoder_input_ids=tgt).logits
        real = tgt != ids.pad
        largest = max(largest, (ours[real] - theirs[real]).abs().max().item())
    return largest


@torch.no_grad()
def greedy_with_transformers(hf, sources: list[list[int]], ids, max_extra_tokens: int, cap: int) -> list[list[int]]:
    """``generate``'s greedy outputs (after <bos>, up to <eos>), sentences of one length in one call."""
    groups: dict[int, list[int]] = {}
    for i, source in enumerate(sources):
        groups.setdefault(len(source), []).append(i)
    outputs: list[list[int]] = [[] for _ in sources]
    for length, indices in groups.items():
        found = hf.generate(input_ids=torch.tensor([sources[i] for i in indices]),
                            max_new_tokens=min(length + max_extra_tokens, cap))
        for i, row in zip(indices, found[:, 1:].tolist()):
            outputs[i] = row[:row.index(ids.eos)] if ids.eos in row else [t for t in row if t != ids.pad]
    return outputs


def main():
    from transformers import AutoModelForSeq2SeqLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="multi30k")
    parser.add_argument("--data", default=str(ROOT / "data" / "multi30k"))
    parser.add_argument("--models", default=str(ROOT / "models" / "multi30k"))
    parser.add_argument("--split", default="test", choices=["train", "valid", "test"])
    parser.add_argument("--max-extra-tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizers, _ = load_directory(args.models, option="--models")
    ids = special_ids(tokenizers)
    frame = read_split(args.data, args.split)
    test = encode_pairs(tokenizers, frame)
    with tempfile.TemporaryDirectory() as scratch:
        to_transformers.export(args.task, Path(args.models), Path(scratch) / "hf", lambda model, state: "", USES)
        hf = AutoModelForSeq2SeqLM.from_pretrained(Path(scratch) / "hf").eval()
    ours = translate(model, test.src, ids, 8192, args.max_extra_tokens)
    theirs = greedy_with_transformers(hf, test.src, ids, args.max_extra_tokens, model.cfg.max_len - 1)
    references = frame["tgt"].tolist()
    print(json.dumps({**header("versus_transformers"), "sentences": len(ours),
                      "largest_logit_difference": largest_logit_difference(model, hf, test, ids),
                      "greedy_outputs_equal": sum(a == b for a, b in zip(ours, theirs)),
                      "bleu_ours": round(translation.score(decode(tokenizers.target, ours), references)["bleu"], 2),
                      "bleu_transformers": round(translation.score(decode(tokenizers.target, theirs),
                                                                   references)["bleu"], 2)}, indent=1))


if __name__ == "__main__":
    main()
