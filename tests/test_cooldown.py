"""train.cooldown: the rate falls linearly to zero over the last share of a run that knows its end (its steps,
or its time budget); 0 leaves the paper's Noam schedule. And what the report says of why training stopped."""

import copy
import json
import logging
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
import yaml

from lib.model import checkpoint
from lib.evaluate import families as evaluate_families
from lib.evaluate.evaluation import EvaluatePaths
from lib.report import reporting
from lib.report.reporting import ReportPaths
from lib.report.captions import stop_caption
from lib.tasks import multi30k
from lib.tasks.params import stage_config
from lib.tasks.writing import run_fetch, run_prepare, run_tokenize
from lib.train import training
from lib.train.seq2seq import seq2seq_lr
from tests.conftest import ROOT, TINY_PARAMS
from transformer.schedules import cooldown_factor


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The tiny cumsum data and tokenizer, made once."""
    root = tmp_path_factory.mktemp("cooldown")
    cfg = lambda stage: stage_config(TINY_PARAMS, "cumsum", stage)  # noqa: E731 - a one-line helper, named where it is used
    run_fetch("cumsum", cfg("fetch"), root / "sources")
    run_prepare("cumsum", cfg("prepare"), root / "data", root / "sources")
    run_tokenize("cumsum", cfg("tokenize"), root / "data", root / "tok")
    return root


def params_with(**train) -> dict:
    params = copy.deepcopy(TINY_PARAMS)
    params["cumsum"]["train"].update(train)
    return params


def train(out, data, params) -> dict:
    return training.run("cumsum", stage_config(params, "cumsum", "train"), data / "data", data / "tok",
                        out / "model.pt", out / "ckpt", out / "live")


def logged_rates(out) -> pd.DataFrame:
    return pd.read_csv(out / "live" / "plots" / "metrics" / "train" / "lr.tsv", sep="\t")


def eq3(step: int, d_model: int, warmup: int, factor: float) -> float:
    """The paper's eq. 3, written out here rather than imported."""
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def test_the_cooldown_factor_is_one_then_falls_linearly_to_zero():
    assert [cooldown_factor(done, 100, 0.2) for done in (0, 79, 80, 90, 100, 120)] == \
        pytest.approx([1, 1, 1, 0.5, 0, 0])
    assert cooldown_factor(99, 100, 0.0) == 1.0  # none


def test_cooldown_0_gives_eq_3s_rate_at_every_step(tmp_path, data):
    params = params_with(epochs=3, cooldown=0.0, time_budget_minutes=60)  # a budget, never reached, changes nothing
    summary = train(tmp_path, data, params)
    rates, cfg = logged_rates(tmp_path), params["cumsum"]["train"]
    assert rates["step"].tolist() == list(range(1, summary["step"] + 1))
    expected = [eq3(step, cfg["model"]["d_model"], cfg["warmup"], cfg["lr_factor"]) for step in rates["step"]]
    assert rates["lr"].tolist() == pytest.approx(expected, rel=1e-12)
    stop = json.loads((tmp_path / "live" / "stopped.json").read_text())
    assert stop["param"] == "epochs" and stop["epoch"] == 3 and stop["step"] == summary["step"]


def test_a_cooldown_by_epochs_ends_its_last_step_near_zero(tmp_path, data):
    params = params_with(epochs=3, cooldown=0.5)
    total = train(tmp_path, data, params)["step"]
    rates, cfg = logged_rates(tmp_path), params["cumsum"]["train"]
    noam = [eq3(step, cfg["model"]["d_model"], cfg["warmup"], cfg["lr_factor"]) for step in rates["step"]]
    factors = [lr / n for lr, n in zip(rates["lr"], noam)]
    half = total // 2
    assert factors[:half] == pytest.approx([1.0] * half)  # Noam's own rate until the last half
    cooling = range(half + 2, total + 1)
    assert factors[half + 1:] == pytest.approx([(total - step + 1) / (total / 2) for step in cooling])
    assert factors[-1] == pytest.approx(1 / (total / 2))  # one step from zero: the run ends where it reaches it


def test_max_steps_is_the_end_a_cooldown_aims_at_when_it_comes_first(tmp_path, data):
    params = params_with(epochs=10, cooldown=0.5, max_steps=20)
    assert train(tmp_path, data, params)["step"] == 20
    cfg = stage_config(params, "cumsum", "train")
    lr = logged_rates(tmp_path)["lr"].tolist()
    assert lr == pytest.approx([seq2seq_lr(cfg, step, 20, 0.0) for step in range(1, 21)])
    assert lr[-1] == pytest.approx(eq3(20, 16, 10, 1.0) / 10)


def test_with_a_cooldown_a_changed_end_starts_afresh(tmp_path, data, caplog):
    """Raising epochs continues a Noam run (test_stages.py); with a cooldown it moves the end, and every rate."""
    train(tmp_path, data, params_with(epochs=1, cooldown=0.5))
    with caplog.at_level(logging.INFO, logger="lib.train.run"):
        summary = train(tmp_path, data, params_with(epochs=2, cooldown=0.5))
    assert not summary["resumed"] and "train.epochs changed (1 -> 2); starting afresh" in caplog.text
    for changed, run in (("max_steps", {"max_steps": 5}), ("time_budget_minutes", {"max_steps": 5,
                                                                                 "time_budget_minutes": 30})):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lib.train.run"):
            assert not train(tmp_path, data, params_with(epochs=2, cooldown=0.5, **run))["resumed"]
        assert f"train.{changed} changed" in caplog.text


def test_a_time_budget_cools_the_rate_to_zero_as_it_ends(tmp_path, data):
    """A budget of 6 seconds, the last half of it cooling: the run stops mid-epoch when the budget is spent, its
    last rate a few per cent of Noam's (one step of the 3 cooling seconds), and the report says why it stopped."""
    params = params_with(epochs=10_000, cooldown=0.5, time_budget_minutes=0.1, checkpoint_every=10_000)
    start = time.perf_counter()
    summary = train(tmp_path, data, params)
    rates, cfg = logged_rates(tmp_path), params["cumsum"]["train"]
    noam = [eq3(step, cfg["model"]["d_model"], cfg["warmup"], cfg["lr_factor"]) for step in rates["step"]]
    factors = [lr / n for lr, n in zip(rates["lr"], noam)]
    assert factors[0] == pytest.approx(1.0)  # no cooling in the budget's first half
    assert all(later <= earlier + 1e-12 for earlier, later in zip(factors, factors[1:]))
    assert factors[-1] < 0.1  # at the end of the budget, the rate has all but reached zero
    last = checkpoint.load(tmp_path / "ckpt" / "last.pt")
    assert 6.0 <= last["elapsed_s"] <= time.perf_counter() - start
    assert last["epoch"] < 10_000 and summary["step"] == rates["step"].iloc[-1]
    stop = json.loads((tmp_path / "live" / "stopped.json").read_text())
    assert stop["param"] == "time_budget_minutes"
    caption = stop_caption(tmp_path / "live")
    assert caption.startswith(f"Training was stopped by the time budget at epoch {stop['epoch']} (spent 0.1 minutes")
    assert "Its rate fell linearly to 0 over the run's last 50% (train.cooldown), toward the time budget's end." \
        in caption
    reports, cfg = tmp_path / "reports", lambda stage: stage_config(params, "cumsum", stage)  # noqa: E731
    paths = dict(data=data / "data", tokenizer=data / "tok", model=tmp_path / "model.pt", metrics=reports /
                 "metrics.json", samples=reports / "samples.jsonl", lengths=reports / "by_length.csv")
    evaluate_families.run("cumsum", cfg("evaluate"), EvaluatePaths(**paths))
    reporting.run("cumsum", cfg("report"), ReportPaths(**paths, live=tmp_path / "live", out=reports / "report.md",
                                                        figures=reports / "figures", losses=reports / "losses.csv"))
    assert caption in (reports / "report.md").read_text()  # and the score by epoch places the last validation


def test_the_report_says_a_budget_stopped_a_run_still_improving(tmp_path):
    stop = {"param": "time_budget_minutes", "reason": "spent 57.2 minutes (train.time_budget_minutes: 55)",
            "epoch": 16, "step": 3700, "valid_metric": "bleu", "last_scores": [39.63, 41.37], "still_rising": True}
    (tmp_path / "stopped.json").write_text(json.dumps(stop))
    assert stop_caption(tmp_path) == (
        "Training was stopped by the time budget at epoch 16 (spent 57.2 minutes (train.time_budget_minutes: 55)), "
        "with validation BLEU still rising (39.63 -> 41.37). A larger budget would likely give a better model.")
    (tmp_path / "stopped.json").write_text(json.dumps({**stop, "param": "epochs", "reason": "trained 8 epochs "
                                                       "(train.epochs)", "epoch": 8, "still_rising": False}))
    assert stop_caption(tmp_path) == "Training stopped at epoch 8: trained 8 epochs (train.epochs)."
    (tmp_path / "stopped.json").write_text(json.dumps({**stop, "param": "epochs", "reason": "trained 7 epochs "
                                                       "(train.epochs)", "epoch": 7, "cooldown": 0.4,
                                                       "planned_steps": 1610}))
    assert stop_caption(tmp_path) == (
        "Training stopped at epoch 7: trained 7 epochs (train.epochs), with validation BLEU still rising (39.63 -> "
        "41.37). Its rate fell linearly to 0 over the run's last 40% (train.cooldown), toward its last step, 1,610.")
    (tmp_path / "stopped.json").write_text(json.dumps({"param": "max_iters", "step": 3400,
                                                       "reason": "trained 3400 steps (train.max_iters)"}))
    assert stop_caption(tmp_path) == "Training stopped: trained 3400 steps (train.max_iters)."  # an LM's
    assert stop_caption(tmp_path / "none") == ""  # a run from before stopped.json


@pytest.mark.slow  # a trainer killed, its own process
@pytest.mark.parametrize("end", [{"epochs": 3}, {"epochs": 10, "max_steps": 25}])
def test_a_killed_run_with_a_cooldown_resumes_to_the_same_weights(tmp_path, data, end):
    """kill -9 mid-run; the re-run resumes and ends with the weights of a straight run, the cooldown set by the
    epochs' steps or by max_steps."""
    params = params_with(cooldown=0.3, checkpoint_every=3, **end)
    params["cumsum"]["train"]["model"].update(d_model=32, d_ff=64)  # slow enough to be killed mid-run
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    command = [sys.executable, "-m", "stages.train", "cumsum", "--params", str(tmp_path / "params.yaml"),
               "--data", str(data / "data"), "--tokenizer", str(data / "tok"), "--model", str(killed / "model.pt"),
               "--checkpoints", str(killed / "ckpt"), "--live", str(killed / "live")]
    train(straight, data, params)
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (killed / "ckpt" / "last.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    process.kill()
    process.wait()
    interrupted = checkpoint.load(killed / "ckpt" / "last.pt")
    assert interrupted["step"] < checkpoint.load(straight / "ckpt" / "last.pt")["step"], "finished before the kill"
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"at step {interrupted['step']}" in result.stderr
    a, b = checkpoint.load(straight / "model.pt"), checkpoint.load(killed / "model.pt")
    assert a["step"] == b["step"] and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert logged_rates(killed)["lr"].tolist() == logged_rates(straight)["lr"].tolist()


def test_a_validation_inside_an_epoch_is_placed_at_its_share_of_the_epoch(tmp_path):
    """A cooled time budget (or max_steps) stops a run inside an epoch, and validates there: the report's score by
    epoch places that row at step / steps-an-epoch, where it raised an error (an epoch of NaN)."""
    metrics = tmp_path / "plots" / "metrics"
    (metrics / "valid").mkdir(parents=True)
    (metrics / "valid" / "bleu.tsv").write_text("step\tbleu\n230\t10.0\n460\t20.0\n504\t25.0\n")
    (metrics / "epoch.tsv").write_text("step\tepoch\n230\t1\n460\t2\n")
    table = reporting.valid_score_table(tmp_path, multi30k.Multi30k())
    assert table["epoch"].tolist() == [1.0, 2.0, 2.19] and table["bleu"].tolist() == [10.0, 20.0, 25.0]
    (metrics / "epoch.tsv").write_text("step\tepoch\n")  # stopped inside the first epoch: no place to give it
    assert reporting.valid_score_table(tmp_path, multi30k.Multi30k())["epoch"].isna().all()
