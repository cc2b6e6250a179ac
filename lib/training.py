"""The training loop: Adam + Noam warmup + label smoothing + clipping (sec. 5), with resume.

Per-step metrics go through dvclive into ``live_dir``; resumable checkpoints
(weights, optimizer, step, RNG, config, best validation loss) into
``checkpoint_dir``; the best weights by validation loss into ``model_path``.
"""

import hashlib
import logging
import math
import shutil
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from dvclive import Live
from tqdm import tqdm

from lib import checkpoint
from lib.config import ConfigError, TrainConfig
from lib.data import Pairs, collate, read_split, token_budget_batches
from lib.masks import padding_mask, target_mask
from lib.metrics import perplexity
from lib.model import build_model
from lib.optim import label_smoothed_nll, noam_lr
from lib.tasks import get_task
from lib.tokenizer import SpecialIds, encode_pairs, load_tokenizer, special_ids

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def seq2seq_loss(model, batch, ids: SpecialIds, smoothing: float) -> tuple[torch.Tensor, int]:
    """Summed label-smoothed loss of a teacher-forced batch, and its target count."""
    logits = model(batch.src, batch.tgt_in, padding_mask(batch.src, ids.pad), target_mask(batch.tgt_in, ids.pad))
    return label_smoothed_nll(logits, batch.tgt_out, ids.pad, smoothing)


@torch.no_grad()
def mean_loss(model, pairs: Pairs, ids: SpecialIds, max_tokens: int, device) -> float:
    """Per-token cross-entropy (no smoothing) over a whole split, in eval mode."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for indices in token_budget_batches(pairs, max_tokens):
        loss, n = seq2seq_loss(model, collate(pairs, indices, ids).to(device), ids, 0.0)
        total, count = total + loss.item(), count + n
    model.train(was_training)
    return total / count


def check_lengths(pairs: Pairs, max_len: int, split: str):
    """Every sequence (with its bos or eos) must fit the positional encoding."""
    longest = max(max(map(len, pairs.src)), max(map(len, pairs.tgt)) + 1)
    if longest > max_len:
        raise ConfigError(
            f"train.model.max_len: {max_len} is shorter than the longest {split} sequence ({longest} tokens)"
        )


def fingerprint(paths: list[Path]) -> str:
    """sha256 over the contents of files and directory trees, in a stable order."""
    digest = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
        for file in files:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def run_identity(cfg: TrainConfig, data_dir, tokenizer_path) -> dict:
    """What a checkpoint must share with this run to be resumed from.

    Everything but ``epochs``: raising it and re-running continues training.
    The inputs' fingerprint covers the data, the tokenizer and this library's
    code, so that a run after any change that DVC reruns training for starts
    afresh instead of resuming a stale model.
    """
    config = {k: v for k, v in asdict(cfg).items() if k != "epochs"}
    code = sorted(Path(__file__).parent.rglob("*.py"))
    return {"config": config, "inputs": fingerprint([Path(data_dir), Path(tokenizer_path), *code])}


def truncate_curves(live_dir: str | Path, step: int):
    """Drop metric rows logged after ``step``: a killed run logged past its last checkpoint."""
    for tsv in (Path(live_dir) / "plots" / "metrics").rglob("*.tsv"):
        frame = pd.read_csv(tsv, sep="\t")
        frame[frame["step"] <= step].to_csv(tsv, sep="\t", index=False)


def _fresh_state() -> dict:
    return {"step": 0, "epoch": 0, "batches_done": 0, "best_valid_loss": math.inf}


def run(
    task: str,
    cfg: TrainConfig,
    data_dir: str | Path,
    tokenizer_path: str | Path,
    model_path: str | Path,
    checkpoint_dir: str | Path,
    live_dir: str | Path,
) -> dict:
    """Train (or resume training) and write the best model; returns a summary."""
    kind = get_task(task).KIND
    device = resolve_device(cfg.device)
    tokenizer = load_tokenizer(tokenizer_path)
    ids = special_ids(tokenizer)
    vocab_size = tokenizer.get_vocab_size()
    train = encode_pairs(tokenizer, read_split(data_dir, "train"))
    valid = encode_pairs(tokenizer, read_split(data_dir, "valid"))
    check_lengths(train, cfg.model.max_len, "train")
    check_lengths(valid, cfg.model.max_len, "valid")

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, kind, vocab_size, vocab_size, joint_vocab=True).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)

    checkpoint_dir = Path(checkpoint_dir)
    last_path, best_path = checkpoint_dir / "last.pt", checkpoint_dir / "best.pt"
    identity = run_identity(cfg, data_dir, tokenizer_path)
    state = _fresh_state()
    resumed = False
    if last_path.is_file():
        saved = checkpoint.load(last_path, map_location=device)
        if {k: saved.get(k) for k in identity} == identity and saved["epoch"] <= cfg.epochs:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            torch.set_rng_state(saved["rng"])
            state = {k: saved[k] for k in state}
            resumed = True
            truncate_curves(live_dir, state["step"])
            log.info("resuming from %s at step %d", last_path, state["step"])
        else:
            log.info("%s was trained with other params or data; starting afresh", last_path)
    if not resumed:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        shutil.rmtree(live_dir, ignore_errors=True)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)

    def save_last():
        checkpoint.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
             **state, **identity},
            last_path,
        )

    live = Live(dir=str(live_dir), resume=resumed, report=None, save_dvc_exp=False, dvcyaml=False)
    model.train()
    while state["epoch"] < cfg.epochs:
        epoch = state["epoch"]
        order = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
        batches = token_budget_batches(train, cfg.max_tokens, order)
        progress = tqdm(batches[state["batches_done"]:], desc=f"epoch {epoch + 1}/{cfg.epochs}",
                        initial=state["batches_done"], total=len(batches), leave=False)
        for indices in progress:
            batch = collate(train, indices, ids).to(device)
            state["step"] += 1
            lr = noam_lr(state["step"], cfg.model.d_model, cfg.warmup, cfg.lr_factor)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum, n_tokens = seq2seq_loss(model, batch, ids, cfg.label_smoothing)
            loss = loss_sum / n_tokens
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

            live.step = state["step"]
            live.log_metric("train/loss", loss.item())
            live.log_metric("train/lr", lr)
            live.log_metric("train/grad_norm", grad_norm.item())
            progress.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.2e}")
            state["batches_done"] += 1
            if state["step"] % cfg.checkpoint_every == 0:
                save_last()

        valid_loss = mean_loss(model, valid, ids, cfg.max_tokens, device)
        live.log_metric("valid/loss", valid_loss)
        live.log_metric("valid/perplexity", perplexity(valid_loss))
        live.log_metric("epoch", epoch + 1)
        live.make_summary()
        log.info("epoch %d: valid loss %.4f", epoch + 1, valid_loss)
        if valid_loss < state["best_valid_loss"]:
            state["best_valid_loss"] = valid_loss
            checkpoint.save_model(model, kind, vocab_size, {"step": state["step"], "valid_loss": valid_loss},
                                  best_path)
        state.update(epoch=epoch + 1, batches_done=0)
        save_last()
    live.end()

    with checkpoint.atomic_path(model_path) as tmp:
        shutil.copyfile(best_path, tmp)
    return {"step": state["step"], "best_valid_loss": state["best_valid_loss"], "resumed": resumed}
