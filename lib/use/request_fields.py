"""What a request to lib.use.serve asks, read and checked: its JSON body, its options within the server's bounds,
its texts; and the model's warnings said in the request's own words. A field that cannot be used is a
``BadRequest``, which the app answers with a 400 naming it."""

import re
import warnings

from flask import request

from lib.core.options import OPTIONS

# What a request may read, at most (the options' bounds are the schema's)
MOST_CHARS = 2000


class BadRequest(ValueError):
    """A field of the request that cannot be used: a 400 naming it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def option(body: dict, name: str, default):
    """The request's value of a generation option (lib.core.options), within the server's bounds; ``default``
    where the body leaves it out."""
    value = body.get(name, default)
    if problem := OPTIONS[name].problem(value, served=True):
        raise BadRequest(name, f"{name} {problem}")
    return value


def flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(name, f"{value!r} is not true or false")
    return value


def text(value, name: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(name, f"{value!r} is not a string")
    if not value.strip():
        raise BadRequest(name, "empty")
    if len(value) > MOST_CHARS:
        raise BadRequest(name, f"{len(value)} characters; at most {MOST_CHARS}")
    return value


def body_of(fields: set[str], required: str) -> dict:
    """The request's JSON object, with only ``fields`` and at least ``required``."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise BadRequest("body", "not a JSON object (send Content-Type: application/json)")
    if unknown := sorted(set(body) - fields):
        raise BadRequest(unknown[0], f"unknown field (known: {', '.join(sorted(fields))})")
    if required not in body:
        raise BadRequest(required, "missing")
    return body


def checked(work, name: str, one: bool = True):
    """``work()``, with its warnings (a word read as <unk>, a text past max_len) returned beside the result, each
    naming the request's field ``name`` (``name[i]``: the i-th of a list, unless ``one``). Every option is checked
    before it runs, so what the model refuses is the text it was given: a 400 naming ``name``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = work()
        except (ValueError, TypeError) as err:
            raise BadRequest(name, str(err)) from None
    return result, [as_requested(str(w.message), name, one) for w in caught]


def as_requested(message: str, name: str, one: bool) -> str:
    """A warning of lib.use.inference as the request names things: the Python method's name dropped
    ("n_best: "), its argument ("sentences[0]") the request's field."""
    message = re.sub(r"^\w+: ", "", message, count=1)
    return re.sub(r"^(sentences|prompt|text)(\[(\d+)\])?",
                  lambda m: name if one or m.group(3) is None else f"{name}[{m.group(3)}]", message, count=1)
