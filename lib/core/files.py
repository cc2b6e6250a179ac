"""File helpers every layer uses: atomic writes, checks of the paths a stage reads and writes, and the
errors that name them. Imports nothing of the project."""

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager, suppress
from fnmatch import fnmatchcase
from pathlib import Path



def first_few(items, shown: int = 5) -> str:
    """The first ``shown`` of ``items`` (texts) for a message, and how many more there are."""
    items = list(items)
    rest = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {rest} more" if rest > 0 else "")


def not_as_written(path: str | Path, what: str, stage: str) -> ValueError:
    """The error for an input that is there but not as ``stage`` writes it: the file, what is wrong, the way out."""
    return ValueError(f"{path}: {what}; re-run the {stage} stage")


def _read_umask() -> int:
    """The process's umask. Reading it means setting it (and setting it straight back), so it is read
    once, at import, before any thread could create a file in between."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


NEW_FILE_MODE = 0o666 & ~_read_umask()  # what open() gives a new file


def check_writable(path: str | Path, directory: bool = False, option: str = ""):
    """Raise a ValueError naming ``path`` (after ``option``, the command-line option that gave it, if any)
    when what is already on disk would stop a file, or a ``directory``, being written there: a directory
    where a file goes, or a file where a directory goes or where one above it goes. A stage checks its
    outputs before its work, so that such a mistake costs a second, not a training run."""
    path = Path(path)
    a_file_above = next((above for above in path.parents if above.exists() and not above.is_dir()), None)
    if a_file_above is not None:
        problem = f"{a_file_above} is a file, where a directory is needed"
    elif directory and path.exists() and not path.is_dir():
        problem = "a file is there, where a directory is written"
    elif not directory and path.is_dir():
        problem = "a directory is there, where a file is written"
    else:
        return
    raise ValueError(f"{named(path, option)}: {problem} (move it or name another path)")


def check_replaceable(path: str | Path, holds: tuple[str, ...], option: str = "", writer: str = ""):
    """Raise a ValueError naming ``path`` (after ``option``, as check_writable) when it is a directory that
    holds anything but what ``writer`` ("the tokenize stage", "the export") writes there (``holds``: the names,
    as fnmatch patterns). The writer replaces the directory whole, so a mistyped path, the models directory for
    its tokenizer/ say, would lose all the rest. Checked before the work, and again by ``atomic_dir``."""
    path = Path(path)
    if not path.is_dir():
        return
    others = sorted(entry.name + "/" * entry.is_dir() for entry in path.iterdir()
                    if not any(fnmatchcase(entry.name, pattern) for pattern in holds))
    if others:
        those, them = ("that", "it") if len(others) == 1 else ("those", "them")
        raise ValueError(f"{named(path, option)}: holds {first_few(others, 4)}, which {writer} does not write; it "
                         f"replaces the directory whole, so {those} would be lost (move {them} or name another "
                         "path)")


def placed(path: str | Path, within: str | Path) -> str:
    """"is" where ``path`` is ``within``, "is in" where it is inside it, links followed on both sides; "" else."""
    real, held = os.path.realpath(path), os.path.realpath(within)
    return "is" if real == held else "is in" if os.path.commonpath([real, held]) == held else ""


def written_by(named: str, how: str, within: str | Path, writer: str) -> str:
    """The error for a path to write, ``named`` as given, that ``how`` ("is" / "is in") ``within``, what the
    ``writer`` stage wrote: a file more there changes a DVC output (`dvc repro` runs that stage again, which
    clears it), one replaced there is lost."""
    return (f"{named}: {how} {within}, which the {writer} stage wrote; writing there would replace or change it "
            "(name a path outside it)")


def named(path: Path, option: str) -> str:
    """``path`` after the command-line ``option`` that gave it, if any: what a check's message names."""
    return f"{option} {path}" if option else str(path)


def check_readable(path: str | Path, directory: bool = False, option: str = "", writer: str = ""):
    """Raise a FileNotFoundError naming ``path`` (after ``option``, as check_writable) when nothing is there,
    with ``writer``, the stage that writes it, to run first; a ValueError when a file is there where a
    ``directory`` is read, or the reverse. Checked before the work, like the outputs."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{named(path, option)}: not found" + (f" (run the {writer} stage first)"
                                                                         if writer else ""))
    if path.is_dir() != directory:
        there, read = ("directory", "file") if path.is_dir() else ("file", "directory")
        raise ValueError(f"{named(path, option)}: a {there} is there, where a {read} is read")


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside ``path``; move it into place only on success.

    A crash or an error while writing leaves the previous file untouched and
    no partial file behind.
    """
    path = Path(path)
    check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, NEW_FILE_MODE)  # mkstemp makes it private (0600): the finished file gets the usual mode
    os.close(fd)
    try:
        with naming(path):
            yield Path(tmp)
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def written_together(fills: list[tuple[str | Path, Callable[[Path], None]]]):
    """Each (path, fill) writes its file through ``atomic_path``, each inside the last's: none goes into place
    until every one is written, and a failed write (a full disk) names its own file."""
    if fills:
        (path, fill), rest = fills[0], fills[1:]
        with atomic_path(path) as tmp:
            fill(tmp)
            written_together(rest)


@contextmanager
def atomic_dir(path: str | Path, holds: tuple[str, ...], writer: str):
    """Yield a fresh temporary directory beside ``path``; it replaces ``path`` only on success.

    ``path`` may be missing, or a directory holding only what ``writer`` writes there (``holds``, fnmatch
    patterns: its own earlier output); one holding anything else is refused first (``check_replaceable``).

    The swap is two renames (the previous directory aside, the new one into place), each atomic, so a
    crash or Ctrl-C at any moment leaves one whole directory at ``path`` or aside, never a half-deleted
    one; the previous directory is deleted only once the new one is in place, and put back otherwise.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    previous = path.with_name(f".{path.name}.previous")
    _put_back(previous, path)  # a run killed between the two renames left it aside
    check_writable(path, directory=True)
    check_replaceable(path, holds, writer=writer)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with naming(path):
            yield tmp
        if path.exists():
            path.rename(previous)
        tmp.rename(path)
    finally:
        _put_back(previous, path)
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def held_alone(path: str | Path, what: str):
    """An OS lock (flock) on the file ``path`` for the ``with`` block: a second process asking for it fails at
    once, naming the one that holds it. The kernel drops the lock when its holder ends, however it ends
    (kill -9 too), so a stale lock file never blocks. The file, and the directories made for it, go at the end."""
    path = Path(path)
    made = [parent for parent in reversed(path.parents) if not parent.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        file = open(path, "a+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "?"
            file.close()
            raise ValueError(f"{what}: another process (PID {holder}) is writing there; wait for it to finish, or "
                             f"stop it (kill {holder})") from None
        if path.exists() and os.stat(path).st_ino == os.fstat(file.fileno()).st_ino:
            break
        file.close()  # its holder removed it as we opened it: lock the file now at the path
    try:
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()}\n")
        file.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # while still held: no one can lock the removed file and think it theirs
        file.close()
        for directory in reversed(made):
            with suppress(OSError):  # one that something else now holds stays
                directory.rmdir()


@contextmanager
def naming(path: Path):
    """An OSError that names no file, as a failed write's (a full disk's) does not, names ``path``: the output
    being written (a file, or a directory of them), so that the one-line error a stage prints says where."""
    try:
        yield
    except OSError as err:
        if err.errno is not None and err.filename is None:  # a system's error (not one made with a message)
            err.filename = str(path)
        raise


def _put_back(previous: Path, path: Path):
    """Return the directory set aside to ``path`` if nothing took its place; delete it if something did."""
    if previous.exists() and not path.exists():
        previous.rename(path)
    shutil.rmtree(previous, ignore_errors=True)
