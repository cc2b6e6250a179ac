"""What the command line reads and writes: files or stdin as UTF-8 text or lines, and outputs written whole."""

import os
import sys
from pathlib import Path

from lib.core import files
from lib.core.text import utf8_lines, utf8_text


def input_bytes(path: str) -> tuple[bytes, str]:
    """A file's (or stdin's, for "-") bytes, and its name for messages."""
    return (sys.stdin.buffer.read(), "stdin") if path == "-" else (Path(path).read_bytes(), path)


def read_input(path: str) -> str:
    """A UTF-8 file (or stdin) as text; bytes that are not UTF-8 are named by line."""
    return utf8_text(*input_bytes(path))


def read_lines(path: str) -> list[str]:
    """The lines of read_input's text as the prepare stage reads a data file's and a terminal's lines come:
    ended by "\\n" or "\\r\\n" only (lib.core.text.utf8_lines)."""
    return utf8_lines(*input_bytes(path))


def write_text(path: str, text: str):
    """Write ``text`` to ``path`` (``-``: stdout), whole. A file is replaced at once (``files.atomic_path``), and
    through a symlink the file it names, so the link stays; a path that is there but is no file (a device
    such as /dev/null, a named pipe, /dev/stdout at a terminal or pipe) is written into, as the shell's
    ``>`` does: replacing it would put a file where the device or pipe was."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    elif os.path.exists(path) and not os.path.isfile(path):  # both follow links, /proc's /dev/stdout too
        with files.naming(Path(path)), open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
    else:
        with files.atomic_path(os.path.realpath(path)) as tmp:
            tmp.write_text(text, encoding="utf-8")
