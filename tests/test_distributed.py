"""torchrun + DDP on 2 CPU processes (gloo) against one process on the same global batches: the
encoder-decoder (token-budget batches, sharded by rows) and the LM (random blocks, split by rows)."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lib.model import checkpoint
from lib.stage import cli
from lib.core import distributed
from tests.conftest import ROOT, run_stage, run_tree, shorten_splits


pytestmark = pytest.mark.slow  # torchrun: processes that start and train


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def stage_command(tmp_path, params_path, out, task="cumsum") -> list[str]:
    """The train stage's arguments after python: tmp_path's data and tokenizer, outputs in ``out``."""
    return ["-m", "stages.train", task, "--data", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tok"),
            "--model", str(out / "model.pt"), "--checkpoints", str(out / "ckpt"), "--live", str(out / "live"),
            "--params", str(params_path)]


def train(tmp_path, params_path, name, processes, task="cumsum", log=None):
    """Run the train stage into tmp_path/name: in this process (conftest.run_stage), or under torchrun in
    ``processes``; ``log``: a list that gets torchrun's stderr."""
    out = tmp_path / name
    command = stage_command(tmp_path, params_path, out, task)
    if processes == 1:
        assert run_stage("train", command[2:]) == 0
        return out
    code, stderr = torchrun(command, processes)
    # A failing rank's reason (a C++ exception, say) comes first; torchrun's summary of it comes last.
    assert code == 0, stderr[:3000] + "\n...\n" + stderr[-1500:]
    if log is not None:
        log.append(stderr)
    return out


def torchrun(command: list[str], processes: int) -> tuple[int, str]:
    """Run ``python *command`` under torchrun in ``processes`` on this machine: its exit status and stderr."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]

    def run():
        result = run_tree([*launcher, *command], timeout=300, cwd=ROOT, env=ENV)
        return [result.returncode], [result.stderr]

    (code,), (stderr,) = launched(run)
    return code, stderr


def launched(launch):
    """``launch()``'s (return codes, stderr texts) of torchrun launchers, launched once more when torchrun lost
    the race for its port: it finds a free port, lets go of it and binds it again, and another process can
    take it in between (pytorch/pytorch#126510). A launch lost to that race says nothing of our code."""
    codes, logs = launch()
    if any(codes) and any("Address already in use" in log for log in logs):
        codes, logs = launch()
    return codes, logs


def written(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def prepare(tmp_path, params: dict, task: str):
    """Write ``params`` to tmp_path/params.yaml and run the task's prepare and tokenize stages there."""
    from lib.tasks.writing import run_tokenize
    from lib.tasks.params import stage_config
    from tests.conftest import fetch_and_prepare

    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(params))
    fetch_and_prepare(task, stage_config(params, task, "fetch"), stage_config(params, task, "prepare"),
                      tmp_path / "data")
    run_tokenize(task, stage_config(params, task, "tokenize"), tmp_path / "data", tmp_path / "tok")
    return params_path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.conftest import TINY_PARAMS

    tmp_path = tmp_path_factory.mktemp("ddp")
    params = yaml.safe_load(yaml.safe_dump(TINY_PARAMS))
    params["cumsum"]["train"]["model"]["dropout"] = 0.0  # dropout masks are drawn per process
    params["cumsum"]["train"]["epochs"] = 1
    # Something to warn of: max_len 5 skips the pairs of length 5, whose targets with their eos are 6 tokens.
    params["cumsum"]["train"].update(too_long="skip", model={**params["cumsum"]["train"]["model"], "max_len": 5})
    params_path = prepare(tmp_path, params, "cumsum")
    shorten_splits(tmp_path / "data", 4)  # the test split and the length study fit whole
    log = []
    return train(tmp_path, params_path, "single", 1), train(tmp_path, params_path, "ddp", 2, log=log), log[0]


def assert_same_model(path, other_path):
    """Two model files hold the same step, weights within 1e-5 and validation loss."""
    single, ddp = checkpoint.load(path), checkpoint.load(other_path)
    assert single["step"] == ddp["step"]
    C = single["model_config"]["d_model"]
    for name, weight in single["model"].items():
        other = ddp["model"][name]
        if name.endswith("qkv_proj.bias"):
            # The key bias adds the same amount to every score of a query, which softmax cancels: its
            # gradient is exactly zero, so what reaches Adam is rounding noise, which Adam scales up to
            # full-size steps. Those entries differ between any two runs that sum in another order, and
            # change nothing the model computes (the validation losses below agree).
            weight, other = torch.cat([weight[:C], weight[2 * C:]]), torch.cat([other[:C], other[2 * C:]])
        assert torch.allclose(weight, other, atol=1e-5), name
    assert ddp["valid_loss"] == pytest.approx(single["valid_loss"], abs=1e-5)


def test_two_processes_train_the_same_model_as_one(runs):
    single, ddp, _ = runs
    assert_same_model(single / "model.pt", ddp / "model.pt")


def test_two_machines_meeting_at_a_rendezvous_train_the_same_model_as_one(runs):
    """docs/distributed.md's two-machine command, both "machines" here: two launchers of the same command, one process
    each, that find each other at a c10d rendezvous endpoint (which numbers them as they arrive: rank 0 may be
    either). Each runs in a directory of its own, which its relative output paths lead into, as on machines
    that share no file system: what rank 0 writes is what one process writes, and rank 1 writes nothing."""
    single, ddp, _ = runs
    root = ddp.parent
    machines = [root / "machine-a", root / "machine-b"]

    def launch():
        for machine in machines:
            shutil.rmtree(machine, ignore_errors=True)
            machine.mkdir()
        with socket.socket() as s:  # a port free now, for the rendezvous store that the first node to arrive opens
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        nodes = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
             "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "test",
             *stage_command(root, root / "params.yaml", Path("out"))],
            cwd=machine, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**ENV, "PYTHONPATH": str(ROOT)}, start_new_session=True)
            for machine in machines]
        try:
            logs = [node.communicate(timeout=300)[1] for node in nodes]
        finally:
            for node in nodes:  # the launcher and its worker: killing the launcher alone leaves the worker running
                with contextlib.suppress(ProcessLookupError):  # all of it has ended
                    os.killpg(node.pid, signal.SIGKILL)
        return [node.returncode for node in nodes], logs

    codes, logs = launched(launch)
    assert codes == [0, 0], "\n".join(f"launcher {i}: ...{log[-2500:]}" for i, log in enumerate(logs))
    writers = [machine for machine in machines if written(machine)]
    assert len(writers) == 1, [written(machine) for machine in machines]  # rank 0's machine, whichever it is
    assert written(writers[0] / "out") == written(single)
    assert_same_model(single / "model.pt", writers[0] / "out" / "model.pt")
    assert sum(log.count("stopped: trained 1 epoch (train.epochs)") for log in logs) == 1
    # The train and valid pairs skipped: said on each machine, by its one process, so each machine's log has it.
    assert [log.count("WARNING lib.") for log in logs] == [2, 2]


def test_raising_epochs_resumes_under_torchrun(runs):
    """2 processes with dropout train 1 epoch, then continue to 2 from rank 0's checkpoint: the very model 2
    processes train in 2 epochs straight. The checkpoint holds each process's random state, and they differ:
    the processes draw dropout masks of their own."""
    root = runs[1].parent
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["cumsum"]["train"]["model"]["dropout"] = 0.1
    paths = {}
    for epochs in (1, 2):
        params["cumsum"]["train"]["epochs"] = epochs
        paths[epochs] = root / f"params-dropout-{epochs}.yaml"
        paths[epochs].write_text(yaml.safe_dump(params))
    first = train(root, paths[1], "ddp-dropout", 2)
    states = checkpoint.load(first / "ckpt" / "last.pt")["rng"]
    draws = []
    for state in states:  # what each state draws: a state holds its seed too, so two of one stream differ
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state["cpu"])
            draws.append(torch.rand(8))
    assert len(states) == 2 and not torch.equal(*draws)
    log = []
    resumed = checkpoint.load(train(root, paths[2], "ddp-dropout", 2, log=log) / "ckpt" / "last.pt")
    assert log[0].count("resuming from") == 1 and "at step" in log[0]  # said once: rank 0 speaks for all
    assert log[0].count("stopped: trained 2 epochs") == 1
    straight = checkpoint.load(train(root, paths[2], "ddp-dropout-straight", 2) / "ckpt" / "last.pt")
    assert resumed["step"] == straight["step"] and resumed["best_valid_loss"] == straight["best_valid_loss"]
    assert all(torch.equal(weight, straight["model"][name]) for name, weight in resumed["model"].items())


def test_a_machine_warns_once(runs):
    """Every process reads the same data with the same params, so a warning about them is every process's:
    a machine's first process says it once, rather than each of its processes (8 times on a machine of 8
    GPUs)."""
    warnings = [line for line in runs[2].splitlines() if "WARNING lib." in line]
    assert [line.split(": ")[1] for line in warnings] == ["train", "valid"], warnings  # "train: skipped 113 of..."


def test_only_rank_zero_writes(runs):
    single, ddp, _ = runs
    assert written(ddp) == written(single)  # the same files, once each, and nothing half-written
    assert not [p for p in ddp.rglob("*") if p.name.endswith(".tmp")]
    steps = (ddp / "live" / "plots" / "metrics" / "train" / "loss.tsv").read_text().splitlines()
    assert len(steps) == 1 + checkpoint.load(ddp / "model.pt")["step"]  # one row per step: one writer


def test_each_process_says_an_error_in_a_line_of_its_own(tmp_path):
    """The processes share the terminal: each says why it stopped in one whole line (print's two writes, the
    text and then the newline, spliced two processes' lines into one). A bad param is alike in every
    process; an error met while training could be one process's own, so it names the rank. Every process
    says it (one kept quiet could end first, and torchrun would stop the others before they said why), but
    the first to fail can have torchrun stop the other first: at least one says the error."""
    from tests.conftest import TINY_PARAMS

    params = yaml.safe_load(yaml.safe_dump(TINY_PARAMS))
    params["cumsum"]["train"]["lr_factor"] = -1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(TINY_PARAMS))
    (tmp_path / "data").mkdir()  # both there, so the stage starts its work; the first thing it reads,
    (tmp_path / "tok").mkdir()  # the tokenizer, is not in here

    def said(params_file):
        code, stderr = torchrun(stage_command(tmp_path, tmp_path / params_file, tmp_path / "out"), 2)
        assert code != 0
        summary = stderr[stderr.index("Root Cause (first observed failure):"):]  # torchrun's, of the first
        return [line for line in stderr.splitlines() if line.startswith("train@cumsum")], summary

    stopped = "train@cumsum: terminated (SIGTERM); nothing was left half-written, and a re-run resumes from"
    lines, summary = said("bad.yaml")
    assert "train@cumsum: error: cumsum.train.lr_factor: must be > 0" in lines, lines
    # torchrun's closing summary of the failed processes shows it, where it said "To enable traceback see: ..."
    assert "  traceback : train@cumsum: error: cumsum.train.lr_factor: must be > 0\n" in summary, summary
    assert all(line == lines[0] or line.startswith(stopped) for line in lines), lines
    lines, _ = said("good.yaml")
    errors = [line for line in lines if not line.startswith(stopped)]
    missing = f"error: {tmp_path / 'tok' / 'tokenizer.json'}: tokenizer not found (run the tokenize stage first)"
    said_by = [re.fullmatch(rf"train@cumsum \(rank (\d) of 2\): {re.escape(missing)}", line) for line in errors]
    assert errors and all(said_by) and len({match[1] for match in said_by}) == len(errors), lines
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("launch, said", [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 in the environment, but not RANK, MASTER_ADDR, MASTER_PORT: start the stage "
     "with torchrun, which sets them all (torchrun --nproc_per_node 2 -m stages.train ...), or unset WORLD_SIZE to "
     "run one process"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' in the environment: not a number of processes (torchrun sets it; unset "
     "it to run one process)"),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29511"},
     "RANK='2' in the environment: not a rank in [0, WORLD_SIZE 2)"),
])
def test_a_launch_torchrun_did_not_make_is_named(tmp_path, launch, said):
    """The stage is started with a WORLD_SIZE in its environment but not the rest torchrun sets (one left in the
    shell, or set by hand): it said a KeyError from inside its own error handling, or a ValueError from int();
    a RANK beyond WORLD_SIZE waited at torch's rendezvous for ever, deaf to SIGTERM. Now one line, exit 2,
    before any work (the data and tokenizer are there: training would start)."""
    from tests.conftest import TINY_PARAMS

    params_path = prepare(tmp_path, TINY_PARAMS, "cumsum")
    env = {name: value for name, value in ENV.items() if name not in ("WORLD_SIZE", "LOCAL_RANK", *cli.LAUNCH)}
    result = run_tree([sys.executable, *stage_command(tmp_path, params_path, tmp_path / "out")], timeout=120,
                      cwd=ROOT, env={**env, **launch})
    assert (result.returncode, result.stderr) == (2, f"train@cumsum: error: {said}\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("local", ["2", "5", "one"])
def test_a_process_beyond_the_machines_gpus_is_named(monkeypatch, local):
    """torchrun --nproc_per_node 4 on a machine of 2 GPUs: local ranks 2 and 3 took cuda:2 and cuda:3, and
    CUDA's "invalid device ordinal" said neither the rank nor the count. Now the stage's one-line error,
    before any work; a run on the CPU takes no GPU, whatever its local rank."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", local)
    said = (f"LOCAL_RANK={local!r} in the environment: this machine has 2 CUDA device(s), one for each process on "
            "it: start at most 2 here (torchrun --nproc_per_node 2), or set train.device: cpu")
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        distributed.local_device(torch.device("cuda"))
    assert distributed.local_device(torch.device("cpu")) == torch.device("cpu")


def test_only_the_train_stage_runs_under_torchrun(tmp_path):
    """Under torchrun, two prepare processes raced to the same temporary directory: one of them failed with
    a traceback (`Cannot save file into a non-existent directory: 'data/.cumsum.tmp'`), and which one wrote
    the data was chance. A stage other than train says it runs once, in every process, before any work."""
    from tests.conftest import TINY_PARAMS

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(TINY_PARAMS))
    code, stderr = torchrun(["-m", "stages.prepare", "cumsum", "--source", str(tmp_path / "sources"), "--out",
                             str(tmp_path / "data"), "--params", str(tmp_path / "params.yaml")], 2)
    assert code != 0
    said = [line for line in stderr.splitlines()  # less one torchrun stopped once the other had failed
            if line.startswith("prepare@cumsum") and not line.startswith("prepare@cumsum: terminated (SIGTERM)")]
    assert said and set(said) == {"prepare@cumsum: error: WORLD_SIZE=2 in the environment: 2 processes, but only the "
                                  "train stage runs in several; each would write the prepare stage's outputs, the "
                                  "same files (run it once: python -m stages.prepare ...)"}, stderr
    assert sorted(os.listdir(tmp_path)) == ["params.yaml"]


BROKEN_STAGE = """
import os, pathlib, sys, time
sys.path.insert(0, {root!r})
from lib.stage.cli import stage_main


def run(task, cfg, args):
    # Both ranks reach the bug: neither fails while the other, slower to start under load, has yet to set up
    # its handling (torchrun would then stop it, and rightly say nothing of a bug it never met).
    here = pathlib.Path(args.params).parent
    (here / ("rank" + os.environ["RANK"])).touch()
    while len(list(here.glob("rank?"))) < 2:
        time.sleep(0.05)
    raise RuntimeError("a bug met in rank " + os.environ["RANK"])


stage_main("train", [], {{}}, run)
"""


def test_an_unforeseen_error_is_a_whole_traceback_and_in_torchruns_summary(tmp_path):
    """A bug met in every process: each says Python's traceback in one write, named by rank (written line by
    line, the processes' tracebacks interleaved), and torchrun's closing summary shows what stopped each
    failed process, a traceback or a foreseen error's line, where it said "To enable traceback see: <link>"."""
    from tests.conftest import TINY_PARAMS

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(TINY_PARAMS))
    (tmp_path / "broken.py").write_text(BROKEN_STAGE.format(root=str(ROOT)))
    code, stderr = torchrun([str(tmp_path / "broken.py"), "cumsum", "--params", str(tmp_path / "params.yaml")], 2)
    assert code != 0
    said = re.findall(r"^train@cumsum \(rank (\d) of 2\): unforeseen error\nTraceback \(most recent call last\):\n"
                      r"(?:  .*\n)+RuntimeError: a bug met in rank (\d)$", stderr, re.MULTILINE)
    assert said and all(rank == met for rank, met in said), stderr  # whole: the rank's own, nothing between
    root = stderr[stderr.index("Root Cause (first observed failure):"):]
    rank = re.search(r"rank +: (\d) ", root)[1]
    assert re.search(r"exitcode +: 1 ", root), root
    assert (f"traceback : train@cumsum (rank {rank} of 2): unforeseen error\n  Traceback (most recent call last):"
            in root), root
    assert f"\n  RuntimeError: a bug met in rank {rank}\n" in root, root
    assert "To enable traceback see" not in stderr


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
    from tests.test_lm import PLAY

    tmp_path = tmp_path_factory.mktemp("ddp_lm")
    (tmp_path / "play.txt").write_text(PLAY)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tasks"] = ["shakespeare"]
    lm = params["shakespeare"]
    lm["fetch"] = {"source": str(tmp_path / "play.txt")}
    # fp32: under the default bf16 the half batches' products round otherwise than the whole batch's, and the
    # weights part by more than 1e-5 within 30 steps
    # Two batches a step: the first's backward runs under DDP's no_sync, the second's averages the sum.
    lm["train"].update(device="cpu", precision="fp32", max_iters=30, batch_size=8, block_size=16, warmup=5,
                       eval_every=10, eval_batches=2, checkpoint_every=10, accumulate=2)
    lm["train"]["model"].update(d_model=32, n_heads=4, decoder_layers=2, d_ff=64, max_len=16,
                                dropout=0.0)  # dropout masks are drawn per process
    lm["report"].update(passage_tokens=16)  # a passage within the blocks
    params_path = prepare(tmp_path, params, "shakespeare")
    return (train(tmp_path, params_path, "single", 1, "shakespeare"),
            train(tmp_path, params_path, "ddp", 2, "shakespeare"))


def test_two_processes_train_the_same_lm_as_one(lm_runs):
    """Each process takes every other row of the global batch of random blocks; the losses average."""
    assert checkpoint.load(lm_runs[1] / "model.pt")["step"] == 30
    assert_same_model(lm_runs[0] / "model.pt", lm_runs[1] / "model.pt")
    assert written(lm_runs[1]) == written(lm_runs[0])  # rank 0 alone writes


def test_each_process_draws_dropout_masks_of_its_own_and_rank_0_those_of_one_process():
    """Every process seeds torch alike to build the same model; dropout then draws from a stream of its own
    (an LM's slices of a batch are alike in shape, and one stream would drop the same units in each)."""
    def draws(rank: int, world: int) -> torch.Tensor:
        torch.manual_seed(7)
        distributed.seed_own_stream(7, distributed.Context(rank, world, torch.device("cpu")))
        return torch.rand(16)

    with torch.random.fork_rng(devices=[]):
        alone, ranks = draws(0, 1), [draws(rank, 3) for rank in range(3)]
    assert torch.equal(ranks[0], alone)
    assert not any(torch.equal(ranks[i], ranks[j]) for i, j in [(0, 1), (0, 2), (1, 2)])
