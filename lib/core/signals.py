"""SIGTERM as an exception (`Terminated`), raised where the process is; inside a training loop it waits for the
end of the step, so that the loop saves a checkpoint on its way out."""

import signal
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM (kill, a scheduler's preemption, the parent `dvc` gone), raised where the stage is, so that it
    unwinds as Ctrl-C does: every temporary file is removed on the way out."""


class _Pending:
    held = False  # inside `held_to_step_ends`
    asked = False  # a SIGTERM came while held


def _on_sigterm(signum, frame):
    if _Pending.held and not _Pending.asked:
        _Pending.asked = True  # a second SIGTERM is not held: it stops a step that takes too long
    else:
        raise Terminated


def raise_on_sigterm():
    signal.signal(signal.SIGTERM, _on_sigterm)


@contextmanager
def held_to_step_ends(hold: bool = True):
    """Within: a SIGTERM waits until the loop calls `stop_requested` at a step's end. ``hold`` False (under
    torchrun, where saving takes every process and each would stop at a different step): raised at once."""
    _Pending.held, _Pending.asked = hold, False
    try:
        yield
    finally:
        _Pending.held = False
    if _Pending.asked:  # came after the loop's last check
        _Pending.asked = False
        raise Terminated


def stop_requested() -> bool:
    """A SIGTERM is waiting: the loop saves its checkpoint now, then calls `stop_if_requested`."""
    return _Pending.asked


def stop_if_requested():
    if _Pending.asked:
        _Pending.asked = False
        raise Terminated
