"""Typed, frozen configuration built from params.yaml: how a section becomes its dataclass, checked.

params.yaml holds ``tasks`` (the tasks to build) and one section per task with
one sub-section per stage: ``<task>.fetch``, ``.prepare``, ``.tokenize``, ``.train`` (with
its ``model``), ``.evaluate`` and ``.report``. Each sub-section becomes one
frozen dataclass (lib.core.sections; ``fetch`` and ``prepare`` are task-specific and live
beside their task). A misspelt, missing or ill-typed key, or an invalid value, raises
ConfigError naming the dotted key before any work starts.
"""

import dataclasses
import math
import types
import typing

from transformer.config import ConfigError, ModelConfig, require  # noqa: F401 (the model's own section)


def _check_type(value, kind, key: str):
    """Return value as type kind (or as the first type of a union that fits), or raise ConfigError naming key."""
    if isinstance(kind, types.UnionType):
        for member in kind.__args__:
            try:
                return _check_type(value, member, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {' or '.join(m.__name__ for m in kind.__args__)}, got {value!r}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float) and isinstance(value, bool) or not isinstance(value, kind):
        hint = ""
        if kind is bool and str(value).lower() in ("yes", "no", "on", "off", "y", "n"):
            hint = " (write true or false: YAML 1.2, as DVC reads params.yaml, takes yes, no, on and off as words)"
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}{hint}")
    return value


def from_dict(cls, raw, key: str):
    """Build dataclass ``cls`` from the mapping ``raw`` found at dotted ``key``.

    Nested dataclass fields are built recursively; a field with a default may
    be left out (it is one that only some settings use). Unknown and missing keys,
    wrong types and values rejected by ``__post_init__`` raise ConfigError.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key (allowed: {', '.join(names)})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    optional = {n for n, f in fields.items() if f.default is not dataclasses.MISSING}
    missing = [n for n in names if n not in raw and n not in optional]
    if missing:
        raise ConfigError(f"{key}.{missing[0]}: missing key")
    values = {}
    for name in (n for n in names if n in raw):
        kind, sub = hints[name], f"{key}.{name}"
        if dataclasses.is_dataclass(kind):
            values[name] = from_dict(kind, raw[name], sub)
        elif isinstance(kind, types.GenericAlias):  # tuple[int, ...] and the like
            items = raw[name]
            if not isinstance(items, list):
                raise ConfigError(f"{sub}: expected a list, got {items!r}")
            values[name] = tuple(_check_type(v, kind.__args__[0], sub) for v in items)
        else:
            values[name] = _check_type(raw[name], kind, sub)
        if isinstance(values[name], float) and not math.isfinite(values[name]):  # YAML's .inf and .nan
            raise ConfigError(f"{sub}: expected a finite number, got {values[name]}")
    try:
        return cls(**values)
    except ConfigError as err:
        raise ConfigError(f"{key}.{err}") from None


def flatten(nested: dict, prefix: str = "") -> dict:
    """{"model": {"d_model": 8}} -> {"model.d_model": 8}"""
    flat = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_seed(seed: int):
    """A seed above 32 bits would be read as its low 32 bits by the CPU's generator (a Mersenne twister),
    the same stream as a smaller seed's."""
    require(0 <= seed < 2**32, "seed", f"{seed} is not in [0, 2**32)")


# The stages in the order dvc.yaml runs them, each reading what the one before wrote.
STAGES = ("fetch", "prepare", "tokenize", "train", "evaluate", "report")
