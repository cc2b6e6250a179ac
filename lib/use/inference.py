"""A trained model from Python: load it once, then translate, sample, score, or read its attention.

    from lib.use.inference import load
    translator = load("models/multi30k")        # what `dvc repro` wrote there: model.pt and tokenizer/
    translator.translate("Ein Hund rennt über die Wiese.", beam_size=5)      # 'A dog runs through the grass.'
    translator.n_best("Zwei Hunde spielen im Schnee.", k=3, beam_size=5)    # [Output(text=..., score=...), ...]
    translator.score("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow.")
    translator.attention("Zwei Hunde spielen im Schnee.")   # {"cross-attention": Attention(layers, rows, cols), ...}

    lm = load("models/shakespeare")
    lm.sample("ROMEO:", max_new_tokens=300, top_k=40, seed=1)
    for piece in lm.stream("ROMEO:"): print(piece, end="", flush=True)    # a continuation, as it is drawn
    lm.score(text)                  # {"tokens": ..., "loss": ..., "perplexity": ..., "bits_per_char": ...}

Each method takes one text (and returns one result) or a list of them (and returns a list). Input is read
as the data was prepared (NFC, stripped). What the model can read only in part (words or characters its
vocabulary lacks, read as <unk>) or not at all (a source longer than its ``max_len``: its output is left
empty) is a ``UserWarning`` naming the text, so that one bad sentence never stops a list; an option out of
range is a ``ValueError`` naming it, and one of the wrong type (``beam_size=2.0``, ``temperature="0.8"``, bytes
for a text) a ``TypeError`` naming it. ``python -m lib.use.generate`` is the command line over these functions.
"""

from pathlib import Path

import torch

from lib.core.distributed import device_named
from lib.evaluate.options import model_defaults
from lib.use import exported
from lib.use.families import USES
from lib.use.language_model import LanguageModel
from lib.use.lines import Attention, Output
from lib.use.translator import Translator

__all__ = ["Attention", "LanguageModel", "Output", "Translator", "load"]  # what a user of the API meets


def load(directory: str | Path, device: str | torch.device = "cpu", task: str | None = None
         ) -> Translator | LanguageModel:
    """The model in ``directory`` (model.pt and tokenizer/, as the train and tokenize stages write them): a
    Translator for a seq2seq model, a LanguageModel for an LM (its family's API, lib.use.families), in eval
    mode on ``device`` ("auto": a GPU where there is one); with ``task``, one trained for it. A leading ``~`` in
    ``directory`` is the home directory. ``.state``: what model.pt records beside the weights (its config, step,
    validation loss)."""
    model, tokenizers, state = exported.load_folder(directory, device_named(device), task=task)
    loaded = USES[state["kind"]].api(model, tokenizers, state, model_defaults(directory))
    loaded.state = {key: value for key, value in state.items() if key != "model"}
    return loaded
