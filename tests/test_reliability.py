"""The failures that ended in a traceback, and two runs that could corrupt each other: each is one line now."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from lib.model import checkpoint
from lib.train import training
from lib.core.config import ConfigError
from lib.tasks.params import stage_config
from lib.tasks import shakespeare
from tests.conftest import ROOT, fetch_and_prepare, run_stage
from tests.test_stages import built, last_line  # noqa: F401 (built: the tiny cumsum pipeline, a fixture)


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A tmpfs of ``size`` at ``path``: a real full disk (root only)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not root'})")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def stage_argv(built, out: Path, params: Path) -> list[str]:
    return ["cumsum", "--params", str(params), "--data", str(built["data"]), "--tokenizer", str(built["tokenizer"]),
            "--model", str(out / "model.pt"), "--checkpoints", str(out / "ckpt"), "--live", str(out / "live")]


def test_a_real_full_disk_saving_a_checkpoint_is_one_line(tmp_path, built, tiny_params, capsys):
    """torch reports ENOSPC as `RuntimeError: [enforce fail at inline_container.cc:672] unexpected pos ...`:
    it is named as the full disk it is, with the file, and nothing half-written is left."""
    with small_disk(tmp_path / "disk", "2m") as disk:
        with pytest.raises(OSError, match=rf"No space left on device: '{disk / 'big.pt'}'"):
            checkpoint.save({"w": torch.zeros(1_000_000)}, disk / "big.pt")
        assert list(disk.iterdir()) == []
        params = tmp_path / "params.yaml"
        params.write_text(yaml.safe_dump(tiny_params))
        (disk / "filler").write_bytes(b"\0" * (2 * 1024 * 1024 - 200_000))  # room for the curves, not the weights
        assert run_stage("train", stage_argv(built, disk, params)) == 2
        said = last_line(capsys.readouterr().err)
        assert said.startswith("train@cumsum: error: [Errno 28] No space left on device: ") and ".pt'" in said
        assert not list((disk / "ckpt").glob(".*.tmp"))


def trainer(built, out: Path, params: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stages.train", *stage_argv(built, out, params)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_second_trainer_on_the_same_paths_stops_at_once(tmp_path, built, tiny_params):
    """An orphaned trainer and the one a fresh `dvc repro` started wrote the same curves, interleaved. The
    second is now refused before it trains, naming the first; the first's curves are a lone run's. (What
    happened is asserted, not how fast: importing torch alone takes seconds on a slow machine under load.)"""
    tiny_params["cumsum"]["train"]["epochs"] = 12
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    first = trainer(built, tmp_path / "run", params)
    lock = tmp_path / "run" / "ckpt.lock"
    deadline = time.monotonic() + 60
    while not (lock.is_file() and lock.read_text().strip() == str(first.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-m", "stages.train", *stage_argv(built, tmp_path / "run", params)],
                            cwd=ROOT, capture_output=True, text=True)
    assert second.returncode == 2
    assert second.stderr.strip().splitlines()[-1] == (
        f"train@cumsum: error: {tmp_path / 'run' / 'ckpt'}: another process (PID {first.pid}) is writing there; "
        f"wait for it to finish, or stop it (kill {first.pid})")
    assert first.poll() is None, "the first trainer was still running while the second was refused"
    assert first.wait(timeout=120) == 0, first.stderr.read()
    training.run("cumsum", stage_config(tiny_params, "cumsum", "train"), built["data"], built["tokenizer"],
                 tmp_path / "alone" / "model.pt", tmp_path / "alone" / "ckpt", tmp_path / "alone" / "live")
    for curve in ("train/loss.tsv", "valid/loss.tsv", "train/lr.tsv"):
        together, alone = (pd.read_csv(tmp_path / run / "live" / "plots" / "metrics" / curve, sep="\t")
                           for run in ("run", "alone"))
        assert together.equals(alone), curve


def test_a_lock_left_by_a_killed_trainer_never_blocks(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom lib.core.files import held_alone\n"
                               "with held_alone(sys.argv[1], 'ckpt'):\n    print('held', flush=True)\n"
                               "    time.sleep(60)", str(tmp_path / "ckpt.lock")], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline() == "held\n"
    from lib.core.files import held_alone

    with pytest.raises(ValueError, match=rf"ckpt: another process \(PID {holder.pid}\) is writing there"):
        with held_alone(tmp_path / "ckpt.lock", "ckpt"):
            pass
    holder.kill()  # kill -9: no clean-up ran, its lock file is left
    holder.wait()
    assert (tmp_path / "ckpt.lock").read_text() == f"{holder.pid}\n"
    with held_alone(tmp_path / "ckpt.lock", "ckpt"):
        assert (tmp_path / "ckpt.lock").read_text() == f"{os.getpid()}\n"
    with held_alone(tmp_path / "models" / "ckpt.lock", "ckpt"):  # and a lock file where none was
        assert (tmp_path / "models" / "ckpt.lock").read_text() == f"{os.getpid()}\n"
    assert not (tmp_path / "models").exists()  # a run leaves no lock file, nor the directory made for it


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_trainer_stops_when_its_parent_dies():
    """SIGTERM to `dvc repro` alone left the train stage running, its parent gone."""
    child = ("import signal, sys, time\nfrom lib.stage.cli import stop_with_parent\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\nstop_with_parent()\n"
             "print('ready', flush=True)\ntime.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                               f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, "
                               "text=True)\nprint(p.pid, flush=True)\nprint(p.stdout.readline(), end='', flush=True)\n"
                               "import time; time.sleep(60)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    assert parent.stdout.readline() == "ready\n"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and "zombie" not in Path(
            f"/proc/{pid}/status").read_text(errors="replace"):
        time.sleep(0.05)
    alive = Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace")
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the child outlived its parent"


def test_params_edited_while_training_fail_the_stage_and_keep_the_checkpoint(tmp_path, built, tiny_params, capsys,
                                                                               monkeypatch):
    """epochs: 3 running, changed to 1 in epoch 1: dvc.lock said 1 for a model of 3 epochs. The stage now
    fails, naming the keys; the checkpoint is kept, and a re-run with the new values resumes from it."""
    import stages.train

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    real_run = stages.train.run

    def edited_half_way(*args):
        edited = yaml.safe_load(params.read_text())
        edited["cumsum"]["train"]["epochs"] = 1
        edited["cumsum"]["train"]["model"]["dropout"] = 0.2
        params.write_text(yaml.safe_dump(edited))
        return real_run(*args)

    monkeypatch.setattr(stages.train, "run", edited_half_way)
    assert run_stage("train", stage_argv(built, tmp_path, params)) == 2
    assert last_line(capsys.readouterr().err) == (
        f"train@cumsum: error: {params}: cumsum.train changed while the stage ran (epochs, model.dropout); its "
        "outputs were made with the values it started with, so it fails rather than let dvc record the new ones: "
        "run it again (dvc repro) to use them; a re-run resumes from its checkpoint where it can")
    assert checkpoint.load(tmp_path / "ckpt" / "last.pt")["epoch"] == 2
    monkeypatch.setattr(stages.train, "run", real_run)
    assert run_stage("train", stage_argv(built, tmp_path, params)) == 0


@pytest.mark.parametrize("saved, found", [
    ([1, 2], "a list, where a model file is a dict"),
    ({"weights": {}}, "no 'model'"),
    ("wrong shapes", "its weights do not fit its model_config: size mismatch for "),
])
def test_a_torch_file_that_is_not_our_model_is_named_in_evaluate_and_generate(tmp_path, built, capsys, saved, found):
    """A valid torch file (a list, another program's dict, weights of other shapes) gave TypeError, KeyError or
    torch's size mismatch, as tracebacks."""
    from lib.use import generate

    models = tmp_path / "models"
    shutil.copytree(built["tokenizer"], models / "tokenizer")
    if saved == "wrong shapes":
        saved = torch.load(built["model"], weights_only=True)
        name = next(k for k in saved["model"] if k.endswith("weight") and saved["model"][k].dim() == 2)
        saved["model"][name] = torch.zeros(3, 3)
    torch.save(saved, models / "model.pt")
    message = f"{models / 'model.pt'}: not a model file written by this project ({found}"
    argv = ["cumsum", "--params", str(ROOT / "params.yaml"), "--data", str(built["data"]), "--tokenizer",
            str(models / "tokenizer"), "--model", str(models / "model.pt"), "--metrics", str(tmp_path / "m.json"),
            "--samples", str(tmp_path / "s.jsonl"), "--lengths", str(tmp_path / "l.csv"),
            "--generation", str(tmp_path / "g.json")]
    assert run_stage("evaluate", argv) == 2
    said = last_line(capsys.readouterr().err)
    assert said.startswith(f"evaluate@cumsum: error: {message}") and said.endswith("; re-run the train stage")
    (tmp_path / "in.txt").write_text("1 2 3\n")
    with pytest.raises(SystemExit) as exit_info:
        generate.main(["--task", "cumsum", "--models", str(models), "--input", str(tmp_path / "in.txt")])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_a_huge_max_len_is_named_where_the_config_is_checked(tiny_params):
    """max_len 10**9 was an out-of-memory error advising to halve train.max_tokens, which cannot help."""
    tiny_params["cumsum"]["train"]["model"]["max_len"] = 1_000_000_000
    with pytest.raises(ConfigError, match=r"^cumsum\.train\.model\.max_len: 1000000000 is above 65536: the position "
                                          r"tables and masks are max_len long"):
        stage_config(tiny_params, "cumsum", "train")


@pytest.mark.parametrize("option, value, message", [
    ("--beam-size", "10000000", "--beam-size 10000000: must be in [1, 1000] (1: greedy)"),
    ("--n-best", "5000", "--n-best 5000: must be in [1, --beam-size 1]"),
])
def test_a_beam_past_its_bound_is_named_before_any_search(tmp_path, built, capsys, option, value, message):
    """--beam-size 10,000,000 was an allocator traceback; 100,000 took a minute and 5 GB on two lines."""
    from lib.use import generate

    (tmp_path / "in.txt").write_text("1 2 3\n")
    with pytest.raises(SystemExit) as exit_info:
        generate.main(["--task", "cumsum", "--models", str(built["model"].parent), "--input", str(tmp_path / "in.txt"),
                       option, value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_max_new_tokens_past_its_bound_is_named():
    from lib.evaluate.options import check

    with pytest.raises(ValueError, match=r"max_new_tokens 1000000: must be in \[1, 100000\]"):
        check(max_new_tokens=1_000_000)


@pytest.mark.parametrize("text", ["R", "RO"])
def test_a_source_too_short_to_cut_fails_at_prepare(tmp_path, text):
    """A 1-character text prepared an empty train.txt, which tokenize took; train then failed with torch's
    `random_ expects 'from' to be less than 'to'`."""
    (tmp_path / "tiny.txt").write_text(text)
    with pytest.raises(ConfigError, match=rf"^shakespeare\.fetch\.source: .*input\.txt holds {len(text)} characters: "
                                          r"too short to cut into a training and a validation text"):
        fetch_and_prepare("shakespeare", shakespeare.FetchConfig(source=str(tmp_path / "tiny.txt")),
                          shakespeare.PrepareConfig(train_fraction=0.9), tmp_path / "data")
    assert not (tmp_path / "data").exists()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_trainer_whose_parent_dies_saves_a_checkpoint_and_a_re_run_ends_as_a_lone_run(tmp_path, built,
                                                                                          tiny_params):
    """The parent `dvc` killed: the trainer ends the step it is in, saves it, and stops; a re-run resumes there
    and makes the same model as a run never stopped."""
    tiny_params["cumsum"]["train"].update(epochs=40, checkpoint_every=10_000)  # no checkpoint but the last
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    argv = [sys.executable, "-m", "stages.train", *stage_argv(built, tmp_path / "run", params)]
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               f"p = subprocess.Popen({argv!r}, stderr=open(sys.argv[1], 'w'))\n"
                               "print(p.pid, flush=True)\ntime.sleep(120)", str(tmp_path / "stderr")],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    curve = tmp_path / "run" / "live" / "plots" / "metrics" / "train" / "loss.tsv"
    deadline = time.monotonic() + 60
    while not (curve.is_file() and len(curve.read_text().splitlines()) > 20) and time.monotonic() < deadline:
        time.sleep(0.02)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and "zombie" not in Path(
            f"/proc/{pid}/status").read_text(errors="replace"):
        time.sleep(0.05)
    said = (tmp_path / "stderr").read_text().strip().splitlines()[-1]
    assert said == ("train@cumsum: terminated (SIGTERM); nothing was left half-written, and a re-run resumes from "
                    "the last checkpoint")
    stopped_at = checkpoint.load(tmp_path / "run" / "ckpt" / "last.pt")["step"]
    assert 20 <= stopped_at < 400 and not (tmp_path / "run" / "model.pt").exists()
    assert run_stage("train", stage_argv(built, tmp_path / "run", params)) == 0
    training.run("cumsum", stage_config(tiny_params, "cumsum", "train"), built["data"], built["tokenizer"],
                 tmp_path / "alone" / "model.pt", tmp_path / "alone" / "ckpt", tmp_path / "alone" / "live")
    resumed, alone = (checkpoint.load(tmp_path / run / "model.pt")["model"] for run in ("run", "alone"))
    assert all(torch.equal(resumed[name], alone[name]) for name in alone)
