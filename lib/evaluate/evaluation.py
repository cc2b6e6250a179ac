"""The evaluate stage: held-out loss, decoded outputs, the task's scores, samples.

seq2seq: test and validation loss and perplexity; greedy (and, with
``beam_size``, beam-search) translations scored by the task, with the time
each search took; every test translation in samples.jsonl; the task's score
by length (cumsum: exact match by digits, multi30k: BLEU by source words).
lm: validation loss over the whole split, bits per character, perplexity,
samples continuing a few prompts, and the loss by the tokens of context read.
"""

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from lib.model import checkpoint
from lib.core.sections import EvaluateConfig, LMEvaluateConfig
from lib.data.pairs import Pairs, read_split, read_text
from lib.core.files import atomic_path
from transformer.decoding import Hypothesis, check_alpha
from transformer.model import parameter_counts
from transformer.sampling import sampled
from lib.evaluate.options import write_defaults
from lib.evaluate.decode import cut_to_fit, score_outputs, translate_n_best
from lib.model.translate import greedy_translate
from lib.model.losses import perplexity
from lib.model.losses import mean_loss
from lib.model.lengths import check_evaluated_lengths, fit_lengths
from lib.core.distributed import device_named
from lib.evaluate.by_length import extra_split_metrics, score_by_source_length
from lib.tasks import get_task
from lib.tasks.base import Task, exact_matches
from lib.data.tokenizer import continuation, decode, encode_pairs, encode_text, lm_ids, special_ids


log = logging.getLogger(__name__)


def greedy_texts(model, pairs: Pairs, ids, tokenizer, cfg: EvaluateConfig) -> list[str]:
    """Greedy search's output for every source in ``pairs``, in order, as text (``tokenizer``: the target
    side's). Greedy search ranks by the next token alone: beam search's length penalty (cfg.alpha) plays no part."""
    return decode(tokenizer, greedy_translate(model, pairs.src, ids, cfg.max_tokens, cfg.max_extra_tokens))


def search_or_model(found: list[Hypothesis], references: list[Hypothesis]) -> dict:
    """Whose fault the wrong outputs are, with the search's outputs and the references scored alike by the
    model: a search error where the reference scores higher (the model prefers it; the search missed it), a
    model error where it does not (the model prefers its own wrong output). Shares of all the sentences;
    what is neither is an output equal to its reference, token for token."""
    wrong = [f.tokens != r.tokens for f, r in zip(found, references)]
    search = [w and r.score > f.score + 1e-4 for w, f, r in zip(wrong, found, references)]  # above float noise
    return {"search_errors": sum(search) / len(found), "model_errors": (sum(wrong) - sum(search)) / len(found)}


@dataclass(frozen=True)
class EvaluatePaths:
    """What the evaluate stage reads and writes, named by the --option dvc.yaml passes each as."""

    data: Path  # the prepared splits
    tokenizer: Path
    model: Path  # model.pt
    metrics: Path  # metrics.json
    samples: Path  # samples.jsonl
    lengths: Path  # by_length.csv
    generation: Path | None = None  # generation.json beside model.pt: the settings decoded with (None: not written)


def write_outputs(metrics: dict, samples: pd.DataFrame, by_length: pd.DataFrame, paths: EvaluatePaths, cfg):
    """All written beside their places, then moved in together: a failure writing any (a full disk) leaves the
    last run's set, never new samples beside old metrics. generation.json holds the decoding settings of
    ``cfg``, the defaults a user of the model then decodes with."""
    if paths.generation is None:
        return write_results(metrics, samples, by_length, paths.metrics, paths.samples, paths.lengths)
    with atomic_path(paths.generation) as settings_tmp:
        write_defaults(settings_tmp, cfg)
        write_results(metrics, samples, by_length, paths.metrics, paths.samples, paths.lengths)


def write_results(metrics: dict, samples: pd.DataFrame, by_length: pd.DataFrame, metrics_path, samples_path,
                  lengths_path):
    with atomic_path(samples_path) as samples_tmp:
        samples.to_json(samples_tmp, orient="records", lines=True, force_ascii=False)
        with atomic_path(lengths_path) as lengths_tmp:
            by_length.to_csv(lengths_tmp, index=False)
            with atomic_path(metrics_path) as metrics_tmp:
                metrics_tmp.write_text(json.dumps(metrics, indent=2) + "\n")


def evaluate_seq2seq(task, cfg: EvaluateConfig, paths: EvaluatePaths):
    device = device_named(cfg.device, f"{task}.evaluate.device")
    chosen = get_task(task)
    model, tokenizers, _ = checkpoint.load_trained(paths.model, paths.tokenizer, device, task)
    frames = {split: read_split(paths.data, split) for split in chosen.evaluated_splits}
    encoded = {split: encode_pairs(tokenizers, frame) for split, frame in frames.items()}
    check_evaluated_lengths(task, encoded, model.cfg.max_len)  # the data of another run, by hand
    encoded["test"], cut = cut_to_fit(encoded["test"], model.cfg.max_len)  # where the task's long_test is "cut"
    if cfg.beam_size > 1:  # greedy search has no length penalty; beam search's is bounded by the model's max_len
        check_alpha(model, cfg.alpha, f"{task}.evaluate.alpha")
    ids = special_ids(tokenizers)

    test, pairs = frames["test"], encoded["test"]
    loss = mean_loss(model, pairs, ids, cfg.max_tokens, device)
    # The valid pairs training validated on: those over max_len it skipped (train.too_long skip) or refused
    valid, _ = fit_lengths(encode_pairs(tokenizers, read_split(paths.data, "valid")), model.cfg.max_len, "valid",
                           "skip")
    valid_loss = mean_loss(model, valid, ids, cfg.max_tokens, device)
    references = test["tgt"].tolist()
    metrics = {"n_test": len(test), **({"n_test_cut": cut} if cut else {}), "loss": loss,
               "perplexity": perplexity(loss), "valid_loss": valid_loss,
               "valid_perplexity": perplexity(valid_loss), "parameters": parameter_counts(model)["total"]}
    searches = {"greedy": 1} | ({f"beam{cfg.beam_size}": cfg.beam_size} if cfg.beam_size > 1 else {})
    scored_references = score_outputs(model, pairs.src, pairs.tgt, ids, cfg.max_tokens)
    outputs = {}
    for name, beam_size in searches.items():
        # Beam search ranks by the length-penalised score; greedy search by the next token alone, so its
        # outputs and the references are compared by their probability.
        alpha = cfg.alpha if beam_size > 1 else 0.0
        started = time.perf_counter()
        found = [hypotheses[0] for hypotheses in translate_n_best(model, pairs.src, ids, cfg.max_tokens,
                                                                   cfg.max_extra_tokens, beam_size, alpha)]
        seconds = time.perf_counter() - started
        outputs[name] = decode(tokenizers.target, [h.tokens for h in found])
        metrics[name] = {**chosen.score(outputs[name], references), "seconds": seconds,
                         "sentences_per_s": len(test) / seconds,
                         **search_or_model(found, [r.with_alpha(alpha) for r in scored_references])}
        if beam_size > 1:
            metrics[name]["alpha"] = cfg.alpha
    # Every test example; the report shows the first n and the worst n by the task's per-example score.
    samples = sample_rows(chosen, "test", test, outputs["greedy"])
    samples = samples.assign(first=test.index < cfg.n_samples,
                             worst=samples["score"].rank(method="first").lt(cfg.n_samples + 1),
                             **{name: texts for name, texts in outputs.items() if name != "greedy"},  # beam's
                             # each reference's share of the test loss, for a paired test between runs
                             reference_nll=[-r.log_prob for r in scored_references],
                             reference_tokens=[len(r.tokens) + r.eos for r in scored_references])
    if extra := chosen.extra_split:  # cumsum's length study: exact match at every length
        frame = frames[extra]
        hypotheses = greedy_texts(model, encoded[extra], ids, tokenizers.target, cfg)
        split_scores, by_length = extra_split_metrics(frame, hypotheses, test)
        metrics.update(split_scores)
        rows = sample_rows(chosen, extra, frame, hypotheses).assign(first=False, worst=False)
        samples = pd.concat([samples, rows], ignore_index=True)
    else:  # multi30k's BLEU by source length
        by_length = score_by_source_length(chosen, test["src"].tolist(), outputs["greedy"], references)
    write_outputs(metrics, samples, by_length, paths, cfg)
    return metrics


def sample_rows(chosen: Task, split: str, frame: pd.DataFrame, hypotheses: list[str]) -> pd.DataFrame:
    """samples.jsonl's rows for one split: each source with its reference and greedy output, scored."""
    references, scored = frame["tgt"].tolist(), chosen.sentence_score
    return pd.DataFrame({
        "split": split, "source": frame["src"].tolist(), "reference": references, "greedy": hypotheses,
        "correct": exact_matches(hypotheses, references),
        "score": [scored(h, r) for h, r in zip(hypotheses, references)],
    })


@torch.no_grad()
def position_losses(model, ids: torch.Tensor, block_size: int, batch_size: int = 32) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """Next-token cross-entropy summed, and counted, by position in the block (``block_size``,), over a whole
    text (N,), N >= 2: every token after the first, predicted within consecutive blocks of ``block_size``
    targets (the last block the rest), each read from its start. Position t reads t + 1 tokens."""
    targets = len(ids) - 1
    n_blocks = targets // block_size
    window = (torch.arange(n_blocks) * block_size)[:, None] + torch.arange(block_size + 1)  # (N, T + 1)
    chunks = list(window.split(batch_size))
    if targets % block_size:  # the tail, shorter than a block
        chunks.append(torch.arange(n_blocks * block_size, len(ids))[None])
    totals, counts = torch.zeros(block_size, dtype=torch.float64), torch.zeros(block_size, dtype=torch.long)
    device = next(model.parameters()).device
    for chunk in chunks:
        tokens = ids[chunk].to(device)  # (B, T + 1)
        logits = model(tokens[:, :-1])  # (B, T, V)
        losses = F.cross_entropy(logits.transpose(1, 2).float(), tokens[:, 1:], reduction="none")  # (B, T)
        T = losses.size(1)
        totals[:T] += losses.sum(0).double().cpu()
        counts[:T] += losses.size(0)
    return totals, counts


def split_loss(model, ids: torch.Tensor, block_size: int, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy over a whole text (position_losses)."""
    totals, counts = position_losses(model, ids, block_size, batch_size)
    return (totals.sum() / counts.sum()).item()


def scores(totals: torch.Tensor, counts: torch.Tensor, n_tokens: int, n_chars: int) -> dict:
    """An LM's loss (nats a token), perplexity and bits per character on a text of ``n_chars`` characters,
    ``n_tokens`` tokens, from position_losses."""
    loss = (totals.sum() / counts.sum()).item()
    return {"tokens": n_tokens, "loss": loss, "perplexity": perplexity(loss),
            "bits_per_char": loss / math.log(2) / (n_chars / n_tokens)}


def text_metrics(model, ids: torch.Tensor, n_chars: int, block_size: int) -> dict:
    """scores() of a text of ``n_chars`` characters encoded as ``ids`` (N,), N >= 2."""
    return scores(*position_losses(model, ids, block_size), len(ids), n_chars)


def loss_by_length(totals: torch.Tensor, counts: torch.Tensor) -> pd.DataFrame:
    """The mean loss at each position that predicted a token, by the tokens of context it read (length, loss)."""
    read = counts > 0
    return pd.DataFrame({"length": (torch.arange(len(counts)) + 1)[read].tolist(),
                         "loss": (totals[read] / counts[read]).tolist()})


def evaluate_lm(task, cfg: LMEvaluateConfig, paths: EvaluatePaths):
    model, tokenizers, state = checkpoint.load_trained(paths.model, paths.tokenizer, task=task)
    tokenizer = tokenizers.target
    text = read_text(paths.data, "valid")
    ids = encode_text(tokenizer, text)
    totals, counts = position_losses(model, ids, state["block_size"])
    metrics = scores(totals, counts, len(ids), len(text))
    metrics = {"n_valid_tokens": metrics.pop("tokens"), **metrics, "parameters": parameter_counts(model)["total"]}
    by_length = loss_by_length(totals, counts)
    generator = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for i, prompt in enumerate(cfg.prompts):
        # A character the training text lacks (a curly quote, an accent) is read as <unk>: the sample is drawn
        # all the same, from a prompt the model cannot see, so the log names it
        prompt_ids, unread = lm_ids(tokenizers, prompt, f"{task}.evaluate.prompts[{i}]")
        for message in unread:
            log.warning(message)
        tokens = sampled(model, prompt_ids, cfg.max_new_tokens, cfg.temperature, cfg.top_k, generator,
                         state["block_size"], cfg.top_p)
        rows.append({"prompt": prompt, "sample": "".join(continuation(tokenizer, prompt_ids, tokens))})
    write_outputs(metrics, pd.DataFrame(rows), by_length, paths, cfg)
    return metrics
