"""The evaluate stage: held-out loss, decoded outputs, the task's scores, samples.

seq2seq: test loss and perplexity, greedy translations scored by the task.
lm: validation loss over the whole split, bits per character, perplexity,
and samples continuing a few prompts.
"""

import json
import math
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from lib import checkpoint
from lib.checkpoint import atomic_path
from lib.config import EvaluateConfig, LMEvaluateConfig
from lib.data import collate, read_split, read_text, token_budget_batches
from lib.decoding import greedy_decode, sample
from lib.metrics import perplexity
from lib.tasks import get_task
from lib.tokenizer import decode, encode, encode_pairs, encode_text, load_tokenizers, special_ids
from lib.training import mean_loss


def translate(model, pairs, ids, tokenizer, cfg: EvaluateConfig, device) -> list[str]:
    """``tokenizer``: the target side's, which decodes."""
    """Greedy hypotheses for every source in ``pairs``, in the original order."""
    hypotheses = [""] * len(pairs)
    for indices in token_budget_batches(pairs, cfg.max_tokens):
        batch = collate(pairs, indices, ids).to(device)
        lengths = (batch.src != ids.pad).sum(dim=1)
        outputs = greedy_decode(model, batch.src, ids, lengths + cfg.max_extra_tokens)
        for i, text in zip(indices, decode(tokenizer, outputs)):
            hypotheses[i] = text
    return hypotheses


def write_outputs(metrics: dict, samples: pd.DataFrame, metrics_path, samples_path):
    with atomic_path(samples_path) as tmp:
        samples.to_json(tmp, orient="records", lines=True, force_ascii=False)
    with atomic_path(metrics_path) as tmp:
        tmp.write_text(json.dumps(metrics, indent=2) + "\n")


def evaluate_seq2seq(task, cfg: EvaluateConfig, data_dir, tokenizer_dir, model_path, metrics_path, samples_path):
    device = torch.device("cpu")
    module = get_task(task)
    tokenizers = load_tokenizers(tokenizer_dir)
    ids = special_ids(tokenizers)
    model, _ = checkpoint.load_model(model_path, device)

    def translate_frame(frame: pd.DataFrame) -> list[str]:
        return translate(model, encode_pairs(tokenizers, frame), ids, tokenizers.target, cfg, device)

    test = read_split(data_dir, "test")
    pairs = encode_pairs(tokenizers, test)
    loss = mean_loss(model, pairs, ids, cfg.max_tokens, device)
    valid_loss = mean_loss(model, encode_pairs(tokenizers, read_split(data_dir, "valid")), ids, cfg.max_tokens,
                           device)
    started = time.perf_counter()
    hypotheses = translate(model, pairs, ids, tokenizers.target, cfg, device)
    greedy_seconds = time.perf_counter() - started
    references = test["tgt"].tolist()
    metrics = {
        "n_test": len(test),
        "loss": loss,
        "perplexity": perplexity(loss),
        "valid_loss": valid_loss,
        "valid_perplexity": perplexity(valid_loss),
        "greedy": {**module.score(hypotheses, references), "seconds": greedy_seconds},
    }
    if hasattr(module, "extra_metrics"):  # e.g. cumsum's exact match by sequence length
        metrics.update(module.extra_metrics(translate_frame, Path(data_dir)))

    scores = [module.sentence_score(h, r) for h, r in zip(hypotheses, references)]
    worst = pd.Series(scores).rank(method="first").lt(cfg.n_samples + 1)
    # Every test example; the report shows the first n and the worst n by the task's per-example score.
    samples = pd.DataFrame({
        "source": test["src"], "reference": references, "greedy": hypotheses,
        "correct": [h == r for h, r in zip(hypotheses, references)], "score": scores,
        "first": test.index < cfg.n_samples, "worst": worst,
    })
    write_outputs(metrics, samples, metrics_path, samples_path)
    return metrics


@torch.no_grad()
def split_loss(model, ids: torch.Tensor, block_size: int, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy over a whole split, cut into consecutive blocks."""
    n_blocks = (len(ids) - 1) // block_size
    starts = torch.arange(n_blocks) * block_size
    window = starts[:, None] + torch.arange(block_size + 1)  # (N, T + 1)
    total = 0.0
    for chunk in window.split(batch_size):
        tokens = ids[chunk]  # (B, T + 1)
        logits = model(tokens[:, :-1])  # (B, T, V)
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tokens[:, 1:].reshape(-1),
                                 reduction="sum").item()
    return total / (n_blocks * block_size)


def evaluate_lm(task, cfg: LMEvaluateConfig, data_dir, tokenizer_dir, model_path, metrics_path, samples_path):
    tokenizer = load_tokenizers(tokenizer_dir).target
    model, state = checkpoint.load_model(model_path)
    text = read_text(data_dir, "valid")
    ids = encode_text(tokenizer, text)
    loss = split_loss(model, ids, state["block_size"])
    chars_per_token = len(text) / len(ids)
    metrics = {
        "n_valid_tokens": len(ids),
        "loss": loss,
        "perplexity": perplexity(loss),
        "bits_per_char": loss / math.log(2) / chars_per_token,
    }
    generator = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for prompt in cfg.prompts:
        prompt_ids = encode(tokenizer, [prompt])[0]
        out = sample(model, prompt_ids, cfg.max_new_tokens, cfg.temperature, cfg.top_k, generator,
                     state["block_size"])
        rows.append({"prompt": prompt, "sample": tokenizer.decode(out[len(prompt_ids):])})
    write_outputs(metrics, pd.DataFrame(rows), metrics_path, samples_path)
    return metrics


def run(task, cfg, data_dir, tokenizer_path, model_path, metrics_path, samples_path) -> dict:
    """The evaluate stage, for the task's kind."""
    evaluate = evaluate_lm if get_task(task).KIND == "lm" else evaluate_seq2seq
    return evaluate(task, cfg, data_dir, tokenizer_path, model_path, metrics_path, samples_path)
