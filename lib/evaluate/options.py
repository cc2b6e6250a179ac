"""A trained model's own decoding defaults: the evaluate stage writes its settings (``generation.json`` beside
model.pt), and a model decodes by default as its report's figures were decoded, with the same beam and length
penalty. The options themselves, their ranges and defaults, are lib.core.options's schema; here, what a caller's
values are checked and completed with.
"""

import json
from dataclasses import fields
from pathlib import Path

from lib.core.options import OPTIONS

GENERATION_FILE = "generation.json"  # the evaluate stage's decoding settings, beside model.pt


def family_options(family: str, served: bool = False) -> tuple[str, ...]:
    """The options a ``family``'s model takes (``served``: those a request to the web app may set), in order."""
    return tuple(name for name, option in OPTIONS.items() if option.family == family and (option.served or not served))


def problems(values: dict, name=str, served: bool = False) -> list[str]:
    """A message for each option in ``values`` (keyword -> value) of the wrong type or out of range, the option
    named by ``name(keyword)`` (a flag, a JSON field)."""
    return [f"{name(key)} {said}" for key, value in values.items()
            if (said := OPTIONS[key].problem(value, served))]


def check(name=str, **values):
    """A TypeError naming every option not of its type (2.0 for an integer, "0.8" for a number), else a
    ValueError naming every one out of its range."""
    wrong_type = {key: value for key, value in values.items() if not OPTIONS[key].of_type(value)}
    if errors := problems(wrong_type, name):
        raise TypeError("; ".join(errors))
    if errors := problems(values, name):
        raise ValueError("; ".join(errors))


def schema_defaults() -> dict:
    return {name: option.default for name, option in OPTIONS.items()}


def or_default(defaults: dict, **values) -> list:
    """Each of ``values`` (keyword -> value), or its default where it is None, in order."""
    return [defaults[name] if value is None else value for name, value in values.items()]


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
