"""``train.init_from``: a run that starts from trained weights (fine-tuning) rather than random ones, once they
are checked to be a model of the same family, model params and tokenizer."""

import json
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import load_model

from lib.core.config import ConfigError
from lib.data.tokenizer import Tokenizers, load_tokenizers
from lib.model import checkpoint

# Model params a fine-tuning run may set anew: regularisation, not the shape or the function of the model
FREE = ("dropout", "attention_dropout", "activation_dropout")


def located(path: Path) -> tuple[dict, Path, Path]:
    """What ``path`` holds: (the model's dict but its weights, the weights' file, its tokenizer folder). A folder
    as the pipeline writes models/<task> (model.pt, tokenizer/), a model.pt with tokenizer/ beside it, or an
    export (model.safetensors, config.json, tokenizer/)."""
    if path.is_dir() and (path / "model.safetensors").is_file():
        return json.loads((path / "config.json").read_text(encoding="utf-8")), path / "model.safetensors", path
    weights = path / "model.pt" if path.is_dir() else path
    if not weights.is_file():
        raise FileNotFoundError(f"train.init_from: {path} holds no model.pt (a copy of models/<task>) and no "
                                "model.safetensors (an export)")
    state = checkpoint.load(weights, remedy="copy the trained model there again")
    return {key: value for key, value in state.items() if key != "model"}, weights, weights.parent


def differences(theirs: dict, kind: str, model, vocab: dict, tokenizers: Tokenizers, folder: Path) -> list[str]:
    """What differs between the trained model's dict ``theirs`` (and its tokenizer in ``folder``) and the model
    this run builds, each naming the param."""
    if theirs.get("kind") != kind:
        return [f"it is a {theirs.get('kind')} model, and this task trains a {kind} model"]
    config = theirs["model_config"]  # a null field is left out of it, as save_model leaves it out
    found = [f"model.{key} {config.get(key)} (train.model.{key} is {value})"
             for key, value in asdict(model.cfg).items() if key not in FREE and config.get(key) != value]
    found += [f"{key} {theirs.get(key)} (this run's tokenizer: {value})" for key, value in vocab.items()
              if theirs.get(key) != value]
    if found:
        return found
    try:
        given = load_tokenizers(folder / "tokenizer")
    except (FileNotFoundError, ValueError) as err:
        return [f"its tokenizer: {err}"]
    for side in ("source", "target"):
        ours, its = getattr(tokenizers, side).get_vocab(), getattr(given, side).get_vocab()
        if ours != its:
            moved = sum(its.get(token) != i for token, i in ours.items())
            found.append(f"its {side} tokenizer ({folder / 'tokenizer'}) gives {moved} of {len(ours)} tokens "
                         "other ids than this run's")
    return found


def start_from(model, path: str, kind: str, vocab: dict, tokenizers: Tokenizers):
    """Load the trained weights at ``path`` (train.init_from) into ``model``, or a ConfigError naming each
    param, size or tokenizer in which they differ."""
    theirs, weights, folder = located(Path(path))
    found = differences(theirs, kind, model, vocab, tokenizers, folder)
    if found:
        raise ConfigError(f"train.init_from: {path} is not a start for this run: " + "; ".join(found))
    if weights.suffix == ".safetensors":
        load_model(model, str(weights))
    else:
        model.load_state_dict(checkpoint.load(weights)["model"])
