"""A trained model as a folder to take away, laid out as a Hugging Face model repository holds one:
``model.safetensors`` (the weights alone: no pickle, no code runs to read them) and ``config.json`` (the
model config, the vocabulary sizes, the special ids, and what model.pt records of its training), beside
the tokenizer's files (lib.use.export writes them, and the model card). ``load_folder`` reads such a
folder, or a models directory as the pipeline writes it; inference, generate and serve load through it.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from lib.core.config import ModelConfig, from_dict
from lib.data.tokenizer import load_tokenizers
from lib.model import checkpoint
from transformer.model import build_model

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def is_exported(directory: Path) -> bool:
    return (directory / WEIGHTS).is_file() and (directory / CONFIG).is_file()


def write(model: torch.nn.Module, state: dict, special_ids: dict, out: Path):
    """The weights (a tied matrix once) and config.json, from model.pt's ``state``, into ``out``."""
    save_model(model, str(out / WEIGHTS))
    config = {key: value for key, value in state.items() if key != "model"} | {"special_ids": special_ids}
    (out / CONFIG).write_text(json.dumps(config, indent=1, default=str) + "\n")


def read(directory: Path, device="cpu", fast: bool = True) -> tuple[torch.nn.Module, dict]:
    """The model of an exported folder, in eval mode on ``device``, and its config (as model.pt's dict)."""
    try:
        state = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
        cfg = from_dict(ModelConfig, state["model_config"], f"{directory / CONFIG}: model_config")
        model = build_model(cfg, state["kind"], state["src_vocab_size"], state["tgt_vocab_size"],
                            state["joint_vocab"], fast)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{directory / CONFIG}: not the config of an exported model ({err}); export it again "
                         "(python -m lib.use.export)") from None
    try:
        load_model(model, str(directory / WEIGHTS), device=str(device))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own kinds for a truncated or alien file
        raise ValueError(f"{directory / WEIGHTS}: weights that do not fit {CONFIG} ({type(err).__name__}: "
                         f"{str(err).splitlines()[0][:200]}); export it again") from None
    return model.to(device).eval(), state


def load_folder(directory: str | Path, device="cpu", option: str = "", task: str | None = None):
    """Either folder a user holds: a models directory (``checkpoint.load_directory``), or an exported folder's
    model (no torch pickle read), with the same checks against its tokenizers and ``task``: (model in eval
    mode, tokenizers, its dict)."""
    directory = Path(directory).expanduser()
    if not is_exported(directory):
        return checkpoint.load_directory(directory, device, option, task)
    model, state = read(directory, device)
    tokenizers = load_tokenizers(directory / "tokenizer")
    checkpoint.check_pair(directory, state, directory / "tokenizer", tokenizers, task)
    return model, tokenizers, state
