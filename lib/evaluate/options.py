"""A trained model's own decoding defaults: the evaluate stage writes its settings (``generation.json`` beside
model.pt), and a model decodes by default as its report's figures were decoded, with the same beam and length
penalty. The options themselves, their ranges and defaults, are lib.core.options's schema.
"""

import json
from dataclasses import fields
from pathlib import Path

from lib.core.options import OPTIONS, schema_defaults

GENERATION_FILE = "generation.json"  # the evaluate stage's decoding settings, beside model.pt


def model_defaults(directory: str | Path) -> dict:
    """The options' defaults for the model in ``directory``: the schema's, with the evaluate stage's decoding
    settings where it wrote them (``generation.json``), so that a model decodes as its report did."""
    defaults = schema_defaults()
    path = Path(directory).expanduser() / GENERATION_FILE
    if path.is_file():
        saved = json.loads(path.read_text())
        defaults |= {key: value for key, value in saved.items() if key in OPTIONS and OPTIONS[key].of_type(value)}
    return defaults


def write_defaults(path: str | Path, cfg):
    """``generation.json``: the decoding settings of an evaluate config (a seq2seq or an LM one)."""
    settings = {field.name: getattr(cfg, field.name) for field in fields(cfg) if field.name in OPTIONS}
    Path(path).write_text(json.dumps(settings, indent=2) + "\n")
