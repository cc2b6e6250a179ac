"""What every stage script shares: parse the task and the paths dvc.yaml gives,
load and validate the stage's params, and turn a known failure (or Ctrl-C, or SIGTERM) into one line; an
unforeseen one keeps Python's traceback, with nothing after it (under torchrun, written whole and named by rank)."""

import argparse
import ctypes
import errno
import json
import logging
import os
import signal
import sys
import time
import traceback

from lib.core import signals
from lib.core.config import ConfigError, flatten
from lib.core.text import load_params
from lib.core.files import check_readable, check_replaceable, check_writable, placed, written_by
from lib.tasks import get_task
from lib.tasks.outputs import holds
from lib.tasks.params import check_stages_after, stage_config


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_with_parent():
    """Linux: SIGTERM this process when its parent dies, so that an orphaned trainer does not run on beside the
    trainer of the next `dvc repro`."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def changed_keys(before: dict, after) -> list[str]:
    """The dotted keys whose values differ between two params sections (a section gone: all of them)."""
    old, new = flatten(before), flatten(after) if isinstance(after, dict) else {}
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


def check_params_kept(path, params: dict, task: str, stage: str):
    """The stage's section of the params file as it was when the stage started: an edit made while it ran
    (a multi30k run takes half an hour) would have `dvc repro` record values the outputs were not made with."""
    started = params[task][stage]
    try:
        now = load_params(path).get(task, {})
    except ConfigError:
        now = {}
    keys = changed_keys(started, now.get(stage) if isinstance(now, dict) else None)
    if keys:
        again = "resumes from its checkpoint where it can" if stage == "train" else "runs it again"
        raise ConfigError(f"{path}: {task}.{stage} changed while the stage ran ({', '.join(keys)}); its outputs "
                          f"were made with the values it started with, so it fails rather than let dvc record the "
                          f"new ones: run it again (dvc repro) to use them; a re-run {again}")


def _world() -> int:
    """How many processes torchrun started (1: not launched by it, or a WORLD_SIZE that is no number, which
    check_launch names). Read here, not through lib.core.distributed, which joins the process group."""
    world = os.environ.get("WORLD_SIZE", "1")
    return int(world) if world.isdigit() else 1


# What torch's rendezvous (env://) reads beside WORLD_SIZE; torchrun sets them all in each process it starts.
LAUNCH = ("RANK", "MASTER_ADDR", "MASTER_PORT")
# The stages that run in several processes (lib.core.distributed); the others would each write the same outputs.
PARALLEL = ("train",)


def check_launch(stage: str):
    """A WORLD_SIZE above 1 in the environment says torchrun started this process: the stage must be one that
    runs in several (under torchrun two prepare processes raced to the same temporary directory), and what
    else torchrun sets must be there, with a RANK below it. (A WORLD_SIZE left in the shell had train fail
    inside torch's rendezvous, its error lost to a KeyError; a RANK of 2 out of 2 waits at the rendezvous for
    a rank that never comes.)"""
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) < 1:
        raise ValueError(f"WORLD_SIZE={world!r} in the environment: not a number of processes (torchrun sets it; "
                         "unset it to run one process)")
    if int(world) == 1:
        return
    if stage not in PARALLEL:
        raise ValueError(f"WORLD_SIZE={world} in the environment: {world} processes, but only the train stage runs in "
                         f"several; each would write the {stage} stage's outputs, the same files (run it once: python "
                         f"-m stages.{stage} ...)")
    if missing := [name for name in LAUNCH if not os.environ.get(name)]:
        raise ValueError(f"WORLD_SIZE={world} in the environment, but not {', '.join(missing)}: start the stage with "
                         f"torchrun, which sets them all (torchrun --nproc_per_node {world} -m stages.{stage} ...), "
                         "or unset WORLD_SIZE to run one process")
    if not (rank := os.environ["RANK"]).isdigit() or int(rank) >= int(world):
        raise ValueError(f"RANK={rank!r} in the environment: not a rank in [0, WORLD_SIZE {world})")


def _exit(status: int):
    """End the stage with ``status`` (0: return). A process that torchrun started (WORLD_SIZE > 1) leaves at
    once, without the interpreter's teardown: there, now and then,
    a thread that torch's gloo or store code left running aborts the finished process ("terminate called
    without an active exception", SIGABRT) after the process group was destroyed, and torchrun then reports
    the whole run failed. By then everything is written: the model and checkpoints atomically, dvclive's
    files closed."""
    if _world() > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    if status:
        sys.exit(status)


# What the machine refused: a full disk or quota, a read-only file system, no permission. Like a bad param, the
# user's to fix, so one line (the file named: lib.model.checkpoint's writes name theirs) rather than a traceback.
REFUSALS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _foreseen(err: Exception) -> bool:
    return (isinstance(err, (ConfigError, FileNotFoundError, ValueError))
            or isinstance(err, OSError) and err.errno in REFUSALS)


FILE, DIRECTORY = "file", "directory"  # what a stage reads or writes at a path

# What each input a stage reads (by its --option) is, and the stage that writes it: dvc.yaml's flow of data.
INPUTS = {"source": (DIRECTORY, "fetch"), "data": (DIRECTORY, "prepare"), "tokenizer": (DIRECTORY, "tokenize"),
          "model": (FILE, "train"), "live": (DIRECTORY, "train"), "metrics": (FILE, "evaluate"),
          "samples": (FILE, "evaluate"), "lengths": (FILE, "evaluate")}
def check_apart(paths: dict[str, str], writes: list[str]):
    """Each path a stage writes (``writes``, by option) must neither be nor hold another path it is given
    (``paths``, by option: what it reads, --params, its other outputs), their links followed: a stage
    replaces what it writes whole, a directory with all it holds, so that other path would be lost. Nor may
    it be in a directory the stage reads (evaluate --samples data/cumsum/test.parquet replaced the test split)."""
    for out in writes:
        for name, path in paths.items():
            if name != out and (how := placed(path, paths[out])):
                raise ValueError(f"--{out} {paths[out]}: {'is' if how == 'is' else 'holds'} --{name} {path}, which "
                                 "writing it would lose (name another path)")
            if name not in writes and INPUTS.get(name, (FILE,))[0] == DIRECTORY and placed(paths[out], path):
                raise ValueError(written_by(f"--{out} {paths[out]}", "is in", f"--{name} {path}", INPUTS[name][1]))


def _say(line: str):
    """``line`` to stderr in one write: torchrun's processes share a terminal, and print's two writes (the
    text, then the newline) from two processes splice their lines into one."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _leave(said: str, status: int):
    """Say ``said`` and end the stage with ``status``. Under torchrun, ``said`` also goes into the error file
    it gives each process (TORCHELASTIC_ERROR_FILE), which its closing summary of the failed processes reads:
    without it, each entry's "traceback" said only "To enable traceback see: <a link to torch's docs>"."""
    _say(said)
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        try:  # the form torch's own ErrorHandler writes; the summary shows py_callstack, each line indented
            with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as file:
                json.dump({"message": {"message": said.splitlines()[0], "extraInfo": {
                    "py_callstack": said, "timestamp": str(int(time.time()))}}}, file)
        except OSError:  # a full disk, say: the line is said above all the same
            pass
    _exit(status)


def _parsed(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The stage's arguments, with --params; then its logging, and SIGTERM raised as `Terminated`."""
    parser.add_argument("--params", default="params.yaml", type=os.path.expanduser,
                        help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    signals.raise_on_sigterm()
    return args


def stage_main(stage: str, reads: list[str], writes: dict[str, str], run, argv: list[str] | None = None):
    """Call ``run(task, cfg, args)``. ``reads`` and ``writes`` are the required --options naming paths: what the
    stage reads (each in INPUTS), and what it writes (each a FILE or a DIRECTORY); both are checked first. A
    leading ``~`` in a path is the home directory, also where the shell leaves it (``--data=~/data``).

    Under torchrun each process it stops says an error, in a line of its own and in torchrun's summary; one
    met in ``run``, where it may be a process's own, names the process's rank. (A process kept quiet could
    leave first, and torchrun would then stop the others before they said why.)"""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{stage}", description=f"The {stage} stage.")
    parser.add_argument("task", help="a task listed in params.yaml: tasks")
    for name in reads:
        parser.add_argument(f"--{name}", required=True, type=os.path.expanduser,
                            help="path to read (dvc.yaml passes it)")
    for name, kind in writes.items():
        parser.add_argument(f"--{name}", required=True, type=os.path.expanduser,
                            help=f"path of the {kind} written (dvc.yaml passes it)")
    args = _parsed(parser, argv)
    who = f"{stage}@{args.task}"
    started = False
    try:
        check_launch(stage)
        check_apart({name: getattr(args, name) for name in [*reads, *writes, "params"]}, list(writes))
        params = load_params(args.params)
        cfg = stage_config(params, args.task, stage)
        check_stages_after(params, args.task, stage)
        for name, kind in writes.items():
            check_writable(getattr(args, name), kind == DIRECTORY, f"--{name}")
            if kind == DIRECTORY:
                check_replaceable(getattr(args, name), holds(get_task(args.task), stage, name), f"--{name}",
                                  f"the {stage} stage")
        for name in reads:  # dvc repro checks them itself; a stage run by hand (under torchrun, say) here
            kind, writer = INPUTS[name]
            check_readable(getattr(args, name), kind == DIRECTORY, f"--{name}", writer)
        started = True
        if stage == "train":
            stop_with_parent()
        run(args.task, cfg, args)
        check_params_kept(args.params, params, args.task, stage)
    except BaseException as err:
        _stopped(who, stage, err, started)
    _exit(0)


def _stopped(who: str, stage: str, err: BaseException, started: bool = False):
    """A stage stopped by ``err``: one line and the exit status, or (unforeseen) Python's traceback.
    ``started``: the stage's own work had begun, where an error may be one process's of several."""
    if isinstance(err, (KeyboardInterrupt, signals.Terminated)):
        # Every output is written whole or not at all, so say what a re-run does; the exit status is the one
        # a shell reports for the signal (128 + its number).
        what, status = ("interrupted", 130) if isinstance(err, KeyboardInterrupt) else ("terminated (SIGTERM)", 143)
        again = "resumes from the last checkpoint" if stage == "train" else "runs the stage again"
        _leave(f"{who}: {what}; nothing was left half-written, and a re-run {again}", status)
    if not isinstance(err, Exception):  # SystemExit (argparse's usage error, say)
        raise err
    rank = f" (rank {os.environ['RANK']} of {_world()})" if started and _world() > 1 else ""
    if _foreseen(err):
        _leave(f"{who}{rank}: error: {err}", 2)
    elif _world() > 1:  # unforeseen under torchrun: Python's traceback, whole (its lines, written one by
        # one, interleaved with the other processes'), named by rank and in torchrun's summary
        _leave(f"{who}{rank}: unforeseen error\n" + "".join(traceback.format_exception(err)).rstrip(), 1)
    # a bug or an unforeseen failure: Python's own traceback, but readable. The traceback keeps every frame's
    # variables alive until the interpreter's teardown, where the git objects dvclive opened (dulwich) fail to
    # close, adding ~25 lines of noise after the error.
    traceback.clear_frames(err.__traceback__)
    raise err


def once_main(stage: str, description: str, writes: str, run, argv: list[str] | None = None):
    """A stage that runs once, not per task (index): ``run(params, out)``, with the errors said as
    stage_main says them."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{stage}", description=description)
    parser.add_argument("--out", required=True, type=os.path.expanduser,
                        help=f"path of the {writes} written (dvc.yaml passes it)")
    args = _parsed(parser, argv)
    try:
        check_launch(stage)
        check_writable(args.out, False, "--out")
        run(load_params(args.params), args.out)
    except BaseException as err:
        _stopped(stage, stage, err)
    _exit(0)
