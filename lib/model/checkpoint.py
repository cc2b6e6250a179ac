"""The one helper that saves and loads checkpoints and models (weights only), and rebuilds a trained model
with the tokenizers it was trained with."""

import errno
import os
import pickle
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from lib.core.config import ModelConfig, from_dict
from lib.core.files import named, atomic_path, check_readable
from lib.data.tokenizer import load_tokenizers
from transformer.model import build_model


def save(obj: dict, path: str | Path):
    """``torch.save`` through an open file: the archive inside is then named "archive" rather than
    after the (random) temporary file, so the same weights give the same bytes, and DVC the same hash."""
    with atomic_path(path) as tmp, open(tmp, "wb") as file:
        try:
            torch.save(obj, file)
        except RuntimeError:  # torch reports a write that a full disk cut short as "unexpected pos ..."
            if shutil.disk_usage(tmp.parent).free < 1 << 20:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
            raise


def load(path: str | Path, map_location="cpu", remedy: str = "re-run the train stage") -> dict:
    """Load a checkpoint or model file saved by ``save``, tensors and plain data only.

    An unreadable file is a ValueError that ends with ``remedy``, what the user can do about it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found (run the train stage first)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as err:
        # torch's own message suggests weights_only=False: wrong advice for a corrupt file.
        raise ValueError(
            f"{path}: not a readable checkpoint (corrupt, truncated, or not written by this project: "
            f"{type(err).__name__}); {remedy}"
        ) from None


def save_model(model, kind: str, vocab: dict, extra: dict, path: str | Path):
    """A self-describing model file: weights plus what is needed to rebuild them.

    ``vocab``: src_vocab_size, tgt_vocab_size and joint_vocab, as build_model takes them. A null model field
    is left out (loading gives it its default), so that a model is the same file whether or not it has the field.
    """
    config = {name: value for name, value in asdict(model.cfg).items() if value is not None}
    save({"model": model.state_dict(), "model_config": config, "kind": kind, **vocab, **extra}, path)


# What save_model writes, and what each is.
MODEL_KEYS = {"model": dict, "model_config": dict, "kind": str, "src_vocab_size": int, "tgt_vocab_size": int,
              "joint_vocab": bool}


def not_a_model(path, what: str) -> ValueError:
    return ValueError(f"{path}: not a model file written by this project ({what}); re-run the train stage")


def load_model(path: str | Path, device="cpu", fast: bool = True):
    """Rebuild a model saved by ``save_model``; returns (model in eval mode, the file's dict).
    ``fast``: run it with transformer.fast's modules (the weights are the same either way). A readable
    torch file that is not one (a list, another program's weights) is named, not a KeyError."""
    state = load(path, map_location=device)
    if not isinstance(state, dict):
        raise not_a_model(path, f"a {type(state).__name__}, where a model file is a dict")
    for key, kind in MODEL_KEYS.items():
        if not isinstance(state.get(key), kind):
            raise not_a_model(path, f"no {key!r}" if key not in state else f"{key!r} is not a {kind.__name__}")
    cfg = from_dict(ModelConfig, state["model_config"], f"{path}: model_config")
    model = build_model(cfg, state["kind"], state["src_vocab_size"], state["tgt_vocab_size"], state["joint_vocab"],
                        fast)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:  # missing, unexpected or wrongly shaped weights
        first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        raise not_a_model(path, f"its weights do not fit its model_config: {first}") from None
    return model.to(device).eval(), state


def load_trained(model_path: str | Path, tokenizer_dir: str | Path, device="cpu", task: str | None = None):
    """A trained model and the tokenizers it was trained with: (model in eval mode, tokenizers, the file's dict).

    The two are written by different stages. A model file and a tokenizer directory from different runs
    would silently read the wrong tokens, or index the embeddings out of range, so their vocabulary sizes
    must agree. ``task``: the one the caller works on. The model file records the task it was trained for,
    and a model of another task (of the same kind: cumsum's, asked to translate German) is refused; a file
    written before the task was recorded says nothing of it, and is taken.
    """
    tokenizers = load_tokenizers(tokenizer_dir)
    model, state = load_model(model_path, device)
    check_pair(model_path, state, tokenizer_dir, tokenizers, task)
    return model, tokenizers, state


def check_pair(model_path, state: dict, tokenizer_dir, tokenizers, task: str | None):
    """``load_trained``'s checks of a model's dict against the tokenizers and the task asked for."""
    if task is not None and state.get("task", task) != task:
        raise ValueError(f"{model_path} was trained for the {state['task']} task, not {task}: name the task it was "
                         f"trained for, or a model of {task}")
    theirs = (tokenizers.source.get_vocab_size(), tokenizers.target.get_vocab_size())
    if theirs != (state["src_vocab_size"], state["tgt_vocab_size"]):
        raise ValueError(f"{model_path} was trained with vocabularies of {state['src_vocab_size']} (source) and "
                         f"{state['tgt_vocab_size']} (target) tokens, but {tokenizer_dir} has {theirs[0]} and "
                         f"{theirs[1]}: they come from different runs (re-run the train stage)")


def load_directory(directory: str | Path, device="cpu", option: str = "", task: str | None = None):
    """``load_trained`` from a models directory laid out as the pipeline writes it (model.pt, tokenizer/),
    which is named first (after ``option``, if one gave it) when it is not there, a task never built, or is
    a file, or when it holds neither (its checkpoints/, say: which stage to run would be the wrong advice).
    A leading ``~`` is the home directory."""
    directory = Path(directory).expanduser()
    check_readable(directory, directory=True, option=option, writer="train")
    if not (directory / "model.pt").exists() and not (directory / "tokenizer").exists():
        raise FileNotFoundError(f"{named(directory, option)}: holds neither model.pt nor tokenizer/: not a models "
                                "directory as the pipeline writes it (models/<task>, holding both)")
    return load_trained(directory / "model.pt", directory / "tokenizer", device, task)
