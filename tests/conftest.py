import contextlib
import copy
import functools
import http.server
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

# Under pytest-xdist (make test's -n auto) each worker takes one core: one torch thread, here and in the
# processes tests start, where two threads each would fight over the same cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402 - after the thread count is set for torch to read
import torch.fx.experimental._config
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lib.core.imports import module_files  # noqa: E402 - after sys.path holds the repository
from transformer.config import ModelConfig  # noqa: E402 - after sys.path holds the repository


def run_tree(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True), except that a time-out kills what the command
    started too (torchrun's workers, a script's python): subprocess.run kills the command alone, and its
    children run on, holding a core the rest of the suite needs (one ran 26 minutes after its test failed)."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def check_rerunnable(outputs: dict[tuple[str, str], Path], task: str = "cumsum"):
    """Each directory a stage wrote (by stage and --option) holds only what lib.stage.cli.holds says it writes
    there, so that running the stage again over it is not refused (and the check is not vacuous: each holds
    something)."""
    from lib.core.files import check_replaceable
    from lib.tasks.outputs import holds
    from lib.tasks import get_task

    for (stage, option), path in outputs.items():
        assert any(path.iterdir()), path
        check_replaceable(path, holds(get_task(task), stage, option), f"--{option}", f"the {stage} stage")


def fetch_and_prepare(task: str, fetch_cfg, prepare_cfg, out: Path) -> Path:
    """The fetch stage, then prepare, as `dvc repro` runs them; the fetched files go beside ``out``."""
    from lib.tasks.writing import run_fetch, run_prepare

    sources = out.with_name(out.name + "_sources")
    run_fetch(task, fetch_cfg, sources)
    run_prepare(task, prepare_cfg, out, sources)
    return sources


@contextlib.contextmanager
def serving(directory: Path):
    """A local HTTP server for ``directory``, standing in for a task's internet source; yields its URL."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # no line a request on stderr
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def offline_fetch_line(task: str, params: dict, tmp_path: Path) -> str:
    """The fetch stage of ``task`` run offline (HF_HUB_OFFLINE, as without internet) as `dvc repro` runs it:
    it must fail with status 2 and no traceback; returns its last line of stderr."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run([sys.executable, "-m", "stages.fetch", task, "--out", str(tmp_path / "sources"),
                             "--params", str(tmp_path / "params.yaml")], cwd=ROOT, capture_output=True, text=True,
                            env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]


def run_stage(stage: str, argv: list[str]) -> int:
    """``python -m stages.<stage> *argv``'s exit status, run in this process (the stage's main, as the command
    runs it): a command's own process spends most of a failing stage's 5 seconds importing torch. Its
    stderr is the caller's capsys's."""
    sigterm = signal.getsignal(signal.SIGTERM)  # the stage turns SIGTERM into an exception: pytest's again after
    try:
        importlib.import_module(f"stages.{stage}").main(argv)
    except SystemExit as exit_:
        return exit_.code
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    return 0


@contextlib.contextmanager
def torch_compile_defaults():
    """A block after which the process-wide switches that lib.train.training.compile_model sets (duck sizing, floats
    as constants) are back at torch's defaults, for the tests that follow."""
    with torch.fx.experimental._config.patch(use_duck_shape=True), torch._dynamo.config.patch(specialize_float=False):
        yield


# A pipeline small enough to run every stage in seconds on 2 cores.
TINY_PARAMS = {
    "tasks": ["cumsum"],
    "cumsum": {
        "fetch": {},
        "prepare": {"seed": 0, "min_length": 2, "max_length": 5, "n_train": 400, "n_valid": 40,
                    "n_test": 60, "vocab_length": 8, "n_per_length": 5},
        "tokenize": {"kind": "word", "min_frequency": 1},
        "train": {
            "seed": 0, "init_from": None, "device": "cpu", "epochs": 2, "max_tokens": 256, "lr_factor": 1.0,
            "warmup": 10, "label_smoothing": 0.1, "clip_norm": 1.0, "checkpoint_every": 5,
            "model": {"d_model": 16, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 32,
                      "dropout": 0.1, "norm_first": False, "tie_embeddings": True, "fused_qkv": True,
                      "max_len": 32},
        },
        "evaluate": {"max_tokens": 512, "max_extra_tokens": 3, "n_samples": 10},
        "report": {"n_attention_examples": 2},
    },
}


@pytest.fixture
def tiny_params():
    return copy.deepcopy(TINY_PARAMS)


def shorten_splits(data: Path, digits: int, splits=("test", "lengths")):
    """Keep the cumsum sequences of at most ``digits`` digits in ``data``'s ``splits``: what the evaluate stage
    decodes must fit train.model.max_len whole (train checks it first), where a test wants train pairs to skip."""
    import pandas as pd

    for split in splits:
        frame = pd.read_parquet(path := data / f"{split}.parquet")
        frame[frame["src"].str.split().str.len() <= digits].reset_index(drop=True).to_parquet(path)


def model_config(**overrides) -> ModelConfig:
    base = dict(d_model=32, n_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64, dropout=0.0,
                norm_first=False, tie_embeddings=False, fused_qkv=True, max_len=64)
    return ModelConfig(**{**base, **overrides})


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class Terminal:
    """stdin at a terminal: ``isatty``, and lines that arrive one at a time; ``before_each`` runs before
    each line is read (and before the end of input)."""

    def __init__(self, lines: list[bytes], before_each):
        self.lines, self.before_each = iter(lines), before_each
        self.buffer = self

    def isatty(self) -> bool:
        return True

    def readline(self) -> bytes:
        self.before_each()
        return next(self.lines, b"")


# --- A temporary DVC repo -------------------------------------------------------------------

def sh(*cmd, cwd, env):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def stages_run(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


# Loaded into every Python process of the test's `dvc repro` (PYTHONPATH): a stage process writes, as it
# exits, its command line and the project's modules it ran.
RECORD_MODULES = """import atexit, os, sys


def record():
    if os.sep + "stages" + os.sep in sys.argv[0]:  # python -m stages.train: argv[0] is .../stages/train.py
        names = sorted(m for m in sys.modules if m.split(".")[0] in ("lib", "stages", "transformer"))
        with open(os.path.join(os.environ["RECORD_MODULES"], str(os.getpid())), "w") as f:
            f.write(" ".join(sys.argv) + "\\n" + "\\n".join(names) + "\\n")


atexit.register(record)
"""


def code_not_in_deps(loaded, repo) -> dict:
    """For each stage that ran: the project's files it loaded that its dvc.yaml entry does not list
    (a change there would leave its outputs stale: dvc repro would not run it again)."""
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((repo / "params.yaml").read_text())
    missing = {}
    for record in loaded.iterdir():
        argv, *names = record.read_text().splitlines()
        match = re.search(r"stages/(\w+)\.py (\w+)?", argv)
        assert match, argv
        stage, task = match.groups()
        if task is None:  # a stage run once (index)
            deps, task = set(stages[stage]["deps"]), ""
        else:
            assert task in params["tasks"], argv
            deps = {dep.replace("${item}", task) for dep in stages[stage]["do"]["deps"]}
        files = {str(path.relative_to(repo)) for name in names for path in module_files(repo, name)}
        unlisted = {file for file in files - {"lib/__init__.py", "stages/__init__.py"}
                    if not any(file == dep or file.startswith(dep + "/") for dep in deps)}  # a directory: its files
        if unlisted:
            missing[f"{stage}@{task}" if task else stage] = sorted(unlisted)
    assert len(list(loaded.iterdir())) >= 5, "every stage's process records what it loaded"
    return missing


DVC = Path(sys.executable).with_name("dvc")


def dvc_repo(tmp_path: Path, params: dict) -> tuple[Path, dict, Path]:
    """A git repo with DVC in ``tmp_path``/repo: the project's code, dvc.yaml and ``params``, committed. Returns
    it, the environment its commands run in, and the folder where each stage's process records what it
    loaded (``code_not_in_deps``)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("lib", "stages", "transformer", "tools", "init"):  # tools: the deps tool, run after adding a module
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, repo / name)
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    site, loaded = tmp_path / "site", tmp_path / "loaded"
    site.mkdir(), loaded.mkdir()
    (site / "sitecustomize.py").write_text(RECORD_MODULES)
    env = {**os.environ, "PATH": f"{DVC.parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(site), "RECORD_MODULES": str(loaded),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    sh("git", "init", "-q", cwd=repo, env=env)
    sh(DVC, "init", "-q", cwd=repo, env=env)
    sh(DVC, "config", "core.analytics", "false", cwd=repo, env=env)
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")  # the train/validation loss template
    sh("git", "add", "-A", cwd=repo, env=env)
    sh("git", "commit", "-qm", "tiny pipeline", cwd=repo, env=env)
    return repo, env, loaded
