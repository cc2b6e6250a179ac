"""The generation options, declared once: each one's family, type, range and default, as the evaluate stage's
params (lib.core.sections), the Python API (lib.use.inference), the command line (lib.use.generate) and the web
app (lib.use.serve) take them, and a message naming the option where a value is of the wrong type or out of
range. What only a caller of a trained model runs (defaults filled in, errors raised) is lib.evaluate.options'."""

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


def within_schema(cfg, names: tuple[str, ...]):
    """A params section's values of the options ``names`` checked against the schema's ranges, as a request's
    are: ``<section>.beam_size: 2000: must be in [1, 1000] (1: greedy)``."""
    for name in names:
        problem = OPTIONS[name].problem(getattr(cfg, name))
        require(problem is None, name, problem or "")
