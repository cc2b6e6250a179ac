"""Text files read as their writers meant them: UTF-8 named by line where it is not, and params.yaml as DVC
reads it (YAML 1.2)."""

from pathlib import Path

from lib.core.config import ConfigError


def utf8_text(raw: bytes, name: str | Path, first_line: int = 1) -> str:
    """``raw`` decoded as UTF-8; bytes that are not are named by line (``raw`` starting at line
    ``first_line`` of ``name``), and by byte within that line. The byte-order mark some editors start a
    file with (Notepad's "UTF-8 with BOM") is dropped: kept, it would be read as part of the first word."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line, line_start = raw.count(b"\n", 0, err.start) + first_line, raw.rfind(b"\n", 0, err.start) + 1
        raise ValueError(f"{name}: line {line}: not UTF-8 (byte {err.start - line_start})") from None
    return text.removeprefix("\ufeff") if first_line == 1 else text


def utf8_lines(raw: bytes, name: str | Path) -> list[str]:
    """``raw``'s lines (utf8_text), each ended by "\\n" or "\\r\\n" and by nothing else: str.splitlines also
    breaks at a form feed, U+2028 or U+0085 within a line."""
    lines = utf8_text(raw, name).split("\n")
    if lines[-1] == "":
        lines.pop()  # what follows the last line's newline
    return [line.removesuffix("\r") for line in lines]


def parse_yaml(text: str, source: str):
    """``text`` read as DVC reads params.yaml and ``-S`` values: YAML 1.2 (ruamel), where PyYAML's YAML 1.1
    read ``3e-4`` and ``0o10`` as text, ``1:30`` as 90, ``yes``/``off`` as booleans and ``010`` as 8, and
    let a key given twice in a mapping quietly take its last value. Anything that is not valid YAML is a
    ConfigError naming ``source`` and, where YAML marks one, the line and column."""
    from ruamel.yaml import YAML, YAMLError  # dvc's own reader, installed with it

    try:
        return YAML(typ="safe").load(text)  # the call dvc makes
    except YAMLError as err:  # a stage run by hand reads the file before dvc has parsed it
        def place(mark):
            return f"line {mark.line + 1}, column {mark.column + 1}"

        where, context = getattr(err, "problem_mark", None), getattr(err, "context_mark", None)
        message = f"{source}: not valid YAML" + (f" at {place(where)}" if where else "")
        message += f": {getattr(err, 'problem', None) or err}"
        if context:  # where the construct that is left open began
            message += f" ({err.context} from {place(context)})"
        raise ConfigError(message) from None
    except ValueError as err:  # YAML's constructors: "seed: 2026-13-45" is read as a date, "!!int x" as a number
        raise ConfigError(f"{source}: not valid YAML: {err} (a date or a tagged value written wrongly)") from None


def load_params(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: " + ("a directory, where the params file is read" if path.is_dir() else
                                         "params file not found"))
    try:
        text = utf8_text(path.read_bytes(), path)
    except ValueError as err:  # not UTF-8, named by line
        raise ConfigError(str(err)) from None
    params = parse_yaml(text, str(path))
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping of params")
    return params
