"""The generation options, declared once: each one's family, type, range and default, as the evaluate stage's
params (lib.core.config), the Python API (lib.use.inference), the command line (lib.use.generate) and the web app
(lib.use.serve) take them, and a message naming the option where a value is of the wrong type or out of range.
"""

import math
import numbers
from dataclasses import dataclass

from transformer.config import require


@dataclass(frozen=True)
class Option:
    name: str  # the keyword, the JSON field; the flag is --name-with-dashes
    family: str  # the model family that takes it: "seq2seq" (translation) or "lm" (the language model)
    integer: bool  # an integer (else any real number)
    default: float
    low: float
    high: float = math.inf
    low_open: bool = False  # low itself is out of range
    served_high: float | None = None  # a tighter bound for the web app, where memory and time are the server's
    served: bool = True  # a request to the web app may set it
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
    Option("beam_size", "seq2seq", True, 1, 1, 1000, served_high=16, note="1: greedy"),
    Option("n_best", "seq2seq", True, 1, 1, 1000, served_high=16),
    Option("alpha", "seq2seq", False, 0.6, 0, served_high=10),
    Option("max_extra_tokens", "seq2seq", True, 20, 0, served=False),
    Option("max_tokens", "seq2seq", True, 8192, 1, served=False),
    Option("max_new_tokens", "lm", True, 200, 1, 100_000, served_high=2000),
    Option("temperature", "lm", False, 0.8, 0, low_open=True, served_high=100),
    Option("top_k", "lm", True, 0, 0, note="0: no top-k filter"),
    Option("top_p", "lm", False, 1.0, 0, 1, low_open=True, note="1: no nucleus filter"),
    Option("num_samples", "lm", True, 1, 1, 1000, served=False),
    Option("seed", "lm", True, 0, -2 ** 63, 2 ** 64 - 1, note="what torch's generator takes",
           shown="in [-2**63, 2**64)"),
)}


def family_options(family: str, served: bool = False) -> tuple[str, ...]:
    """The options a ``family``'s model takes (``served``: those a request to the web app may set), in order."""
    return tuple(name for name, option in OPTIONS.items() if option.family == family and (option.served or not served))


def served_defaults(defaults: dict) -> tuple[dict, list[str]]:
    """``defaults`` (a model's, from its evaluate stage) within the web app's bounds, and a note for each one
    brought down to its bound: a model evaluated with beam_size 32 is served at 16, not refused every request."""
    kept, notes = dict(defaults), []
    for name, value in defaults.items():
        high = OPTIONS[name].served_high if name in OPTIONS else None
        if high is not None and OPTIONS[name].of_type(value) and value > high:
            kept[name] = type(value)(high)
            notes.append(f"{name}: the model's default {value} (its evaluate stage's) is past the server's bound "
                         f"{high:g}; a request that leaves {name} out gets {high:g}")
    return kept, notes


def within_schema(cfg, names: tuple[str, ...]):
    """A params section's values of the options ``names`` checked against the schema's ranges, as a request's
    are: ``<section>.beam_size: 2000: must be in [1, 1000] (1: greedy)``."""
    for name in names:
        problem = OPTIONS[name].problem(getattr(cfg, name))
        require(problem is None, name, problem or "")


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
