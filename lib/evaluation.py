"""The evaluate stage: test loss, greedy translations, the task's scores, samples."""

import json
from pathlib import Path

import pandas as pd
import torch

from lib import checkpoint
from lib.checkpoint import atomic_path
from lib.config import EvaluateConfig
from lib.data import collate, read_split, token_budget_batches
from lib.decoding import greedy_decode
from lib.metrics import perplexity
from lib.tasks import get_task
from lib.tokenizer import decode, encode_pairs, load_tokenizer, special_ids
from lib.training import mean_loss


def translate(model, pairs, ids, tokenizer, cfg: EvaluateConfig, device) -> list[str]:
    """Greedy hypotheses for every source in ``pairs``, in the original order."""
    hypotheses = [""] * len(pairs)
    for indices in token_budget_batches(pairs, cfg.max_tokens):
        batch = collate(pairs, indices, ids).to(device)
        lengths = (batch.src != ids.pad).sum(dim=1)
        outputs = greedy_decode(model, batch.src, ids, lengths + cfg.max_extra_tokens)
        for i, text in zip(indices, decode(tokenizer, outputs)):
            hypotheses[i] = text
    return hypotheses


def run(
    task: str,
    cfg: EvaluateConfig,
    data_dir: str | Path,
    tokenizer_path: str | Path,
    model_path: str | Path,
    metrics_path: str | Path,
    samples_path: str | Path,
) -> dict:
    device = torch.device("cpu")
    tokenizer = load_tokenizer(tokenizer_path)
    ids = special_ids(tokenizer)
    model, _ = checkpoint.load_model(model_path, device)
    test = read_split(data_dir, "test")
    pairs = encode_pairs(tokenizer, test)

    loss = mean_loss(model, pairs, ids, cfg.max_tokens, device)
    hypotheses = translate(model, pairs, ids, tokenizer, cfg, device)
    references = test["tgt"].tolist()
    metrics = {
        "n_test": len(test),
        "loss": loss,
        "perplexity": perplexity(loss),
        "greedy": get_task(task).score(hypotheses, references),
    }
    samples = pd.DataFrame(
        {"source": test["src"], "reference": references, "greedy": hypotheses,
         "correct": [h == r for h, r in zip(hypotheses, references)]}
    ).head(cfg.n_samples)
    with atomic_path(samples_path) as tmp:
        samples.to_csv(tmp, sep="\t", index=False)
    with atomic_path(metrics_path) as tmp:
        tmp.write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics
