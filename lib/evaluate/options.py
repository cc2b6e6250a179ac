"""The generation options, declared once: each one's type, range and default, as the Python API
(lib.use.inference), the command line (lib.use.generate) and the web app (lib.use.serve) take them, and a
message naming the option where a value is of the wrong type or out of range.

A trained model's own defaults come from the evaluate stage (``generation.json`` beside model.pt): a model
decodes by default as its report's figures were decoded, with the same beam and length penalty.
"""

import json
import math
import numbers
from dataclasses import dataclass, fields
from pathlib import Path

GENERATION_FILE = "generation.json"  # the evaluate stage's decoding settings, beside model.pt


@dataclass(frozen=True)
class Option:
    name: str  # the keyword, the JSON field; the flag is --name-with-dashes
    integer: bool  # an integer (else any real number)
    default: float
    low: float
    high: float = math.inf
    low_open: bool = False  # low itself is out of range
    served_high: float | None = None  # a tighter bound for the web app, where memory and time are the server's
    note: str = ""  # what a value means, after the range
    shown: str = ""  # the range as a message says it, where the numbers are too long to read

    @property
    def what(self) -> str:
        return "an integer" if self.integer else "a number"

    def of_type(self, value) -> bool:
        """True and False are neither a count nor a rate: a flag given for one is a mistake."""
        kind = numbers.Integral if self.integer else numbers.Real
        return isinstance(value, kind) and not isinstance(value, bool)

    def range_text(self, high: float) -> str:
        if self.shown and high == self.high:
            text = self.shown
        elif high == math.inf:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {high:g}]"
        return f"{text} ({self.note})" if self.note else text

    def problem(self, value, served: bool = False) -> str | None:
        """What is wrong with ``value`` for this option (None: nothing)."""
        if not self.of_type(value):
            return f"{value!r}: must be {self.what}"
        high = self.served_high if served and self.served_high is not None else self.high
        if value < self.low or (self.low_open and value == self.low) or value > high:
            return f"{value}: must be {self.range_text(high)}"
        return None


# Upper bounds where memory and time grow with the value: a step of beam search scores beam x vocabulary.
OPTIONS = {option.name: option for option in (
    Option("beam_size", True, 1, 1, 1000, served_high=16, note="1: greedy"),
    Option("n_best", True, 1, 1, 1000, served_high=16),
    Option("alpha", False, 0.6, 0, served_high=10),
    Option("max_extra_tokens", True, 20, 0),
    Option("max_tokens", True, 8192, 1),
    Option("max_new_tokens", True, 200, 1, 100_000, served_high=2000),
    Option("temperature", False, 0.8, 0, low_open=True, served_high=100),
    Option("top_k", True, 0, 0, note="0: no top-k filter"),
    Option("top_p", False, 1.0, 0, 1, low_open=True, note="1: no nucleus filter"),
    Option("num_samples", True, 1, 1, 1000),
    Option("seed", True, 0, -2 ** 63, 2 ** 64 - 1, note="what torch's generator takes", shown="in [-2**63, 2**64)"),
)}


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
