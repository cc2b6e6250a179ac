"""Each stage's ``run`` on tiny params in a temporary directory, and resuming training."""

import contextlib
import errno
import functools
import importlib
import io
import json
import logging
import os
import platform
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import dvclive
import pandas as pd
import pytest
import torch
import yaml

from lib.report.reporting import ReportPaths
from lib.report import captions
from lib.model import checkpoint
from lib.train import curves
from lib.evaluate import evaluation
from lib.evaluate import families as evaluate_families
from lib.evaluate import families as evaluate_families
from lib.evaluate.evaluation import EvaluatePaths
from lib.evaluate.by_length import exact_up_to
from lib.report import attention_maps
from lib.core import files
from lib.report import reporting, sections
from lib.report.length_study import breaking_length
from lib.data import tokenizer
from lib.tasks.writing import run_tokenize
from lib.train import averaging, seq2seq, training
from lib.model import device as lib_device
from lib.stage.cli import DIRECTORY, FILE, INPUTS
from lib.tasks.outputs import HOLDS, TASK_DIRECTORIES
from lib.core.config import ConfigError
from lib.tasks.params import stage_config
from lib.data.pairs import collate, read_split, read_text, token_budget_batches
from lib.model.translate import greedy_translate
from transformer.masks import padding_mask, target_mask
from transformer.model import build_model, parameter_counts
from transformer.loss import smoothed_loss_floor
from lib.tasks import cumsum
from lib.tasks.writing import run_fetch, run_prepare
from tests.conftest import (ROOT, TINY_PARAMS, Terminal, check_rerunnable, model_config, run_stage, shorten_splits,
                            torch_compile_defaults)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Run prepare -> tokenize -> train -> evaluate -> report once; return the paths."""
    from tests.conftest import TINY_PARAMS as params

    root = tmp_path_factory.mktemp("pipeline")
    p = {
        "data": root / "data", "tokenizer": root / "models" / "tokenizer",
        "model": root / "models" / "model.pt", "checkpoints": root / "models" / "checkpoints",
        "live": root / "reports" / "cumsum" / "train", "metrics": root / "reports" / "cumsum" / "metrics.json",
        "samples": root / "reports" / "cumsum" / "samples.jsonl", "report": root / "reports" / "cumsum" / "report.md",
        "figures": root / "reports" / "cumsum" / "figures", "lengths": root / "reports" / "cumsum" / "by_length.csv",
        "losses": root / "reports" / "cumsum" / "losses.csv", "sources": root / "sources",
    }
    cfg = lambda stage: stage_config(params, "cumsum", stage)  # noqa: E731 - a one-line helper, named where it is used
    run_fetch("cumsum", cfg("fetch"), p["sources"])
    run_prepare("cumsum", cfg("prepare"), p["data"], p["sources"])
    run_tokenize("cumsum", cfg("tokenize"), p["data"], p["tokenizer"])
    p["summary"] = training.run("cumsum", cfg("train"), p["data"], p["tokenizer"], p["model"],
                                p["checkpoints"], p["live"])
    p["scores"] = evaluate_families.run("cumsum", cfg("evaluate"), EvaluatePaths(
        data=p["data"], tokenizer=p["tokenizer"], model=p["model"], metrics=p["metrics"], samples=p["samples"],
        lengths=p["lengths"]))
    reporting.run("cumsum", cfg("report"), ReportPaths(
                      data=p["data"], tokenizer=p["tokenizer"], model=p["model"], metrics=p["metrics"],
                      samples=p["samples"], lengths=p["lengths"], live=p["live"],
                      out=p["report"], figures=p["figures"], losses=p["losses"]))
    return p


def train_into(out: Path, params: dict, built: dict, data: Path | None = None) -> dict:
    """The train stage on ``built``'s data (or ``data``) and tokenizer, with ``params``; outputs model.pt, ckpt
    and live in ``out``. Returns training.run's summary."""
    return training.run("cumsum", stage_config(params, "cumsum", "train"), data or built["data"], built["tokenizer"],
                        out / "model.pt", out / "ckpt", out / "live")


def test_written_files_have_the_usual_mode(built):
    """Atomic writes go through a private temporary file; what lands must not stay private (0600)."""
    fresh = built["data"].parent / "fresh"
    fresh.write_text("")
    expected = fresh.stat().st_mode & 0o777  # what the umask gives any new file
    fresh.unlink()
    modes = {str(f.relative_to(built["data"].parent)): oct(f.stat().st_mode & 0o777)
             for f in built["data"].parent.rglob("*") if f.is_file()}
    assert "models/model.pt" in modes and "models/checkpoints/last.pt" in modes
    assert {name: mode for name, mode in modes.items() if mode != oct(expected)} == {}


def test_tokenizer_has_specials_and_every_sum(built):
    tok = tokenizer.load_tokenizers(built["tokenizer"]).target
    ids = tokenizer.special_ids(tok)
    assert len({ids.pad, ids.bos, ids.eos, ids.unk}) == 4
    assert all(tok.token_to_id(str(n)) is not None for n in range(73))  # 9 * vocab_length
    assert tokenizer.decode(tok, tokenizer.encode(tok, ["3 4 8 72"])) == ["3 4 8 72"]
    unknown = lambda text: tokenizer.unknown_words(text, tok.encode(text, add_special_tokens=False), ids.unk)  # noqa: E731 - a one-line helper, named where it is used
    assert unknown("3 x 8 yy 4") == ["x", "yy"]  # what a reader sees as <unk>
    assert unknown("3 4 8") == []


def test_cumsum_refuses_a_min_frequency_its_closed_vocabulary_cannot_use(tmp_path, built, tiny_params):
    """It once repeated the alphabet min_frequency times: 10**9 took minutes and 8 GB before failing."""
    tiny_params["cumsum"]["tokenize"]["min_frequency"] = 10**9
    with pytest.raises(ConfigError, match=r"cumsum\.tokenize\.min_frequency: 1000000000, but .* closed .* must be 1"):
        run_tokenize("cumsum", stage_config(tiny_params, "cumsum", "tokenize"), built["data"], tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


def test_train_writes_model_checkpoints_and_curves(built):
    state = checkpoint.load(built["model"])
    assert state["kind"] == "seq2seq" and state["valid_loss"] == built["summary"]["best_valid_loss"]
    assert 0 <= state["initial_repeats_input"] <= 1 and state["label_smoothing"] == 0.1  # for the report
    last = checkpoint.load(built["checkpoints"] / "last.pt")
    assert {"model", "optimizer", "rng", "step", "epoch", "config", "inputs", "best_valid_loss"} <= set(last)
    assert last["epoch"] == 2
    losses = pd.read_csv(built["live"] / "plots" / "metrics" / "train" / "loss.tsv", sep="\t")
    assert len(losses) == last["step"]
    assert losses["loss"].iloc[-5:].mean() < losses["loss"].iloc[:5].mean()
    valid = pd.read_csv(built["live"] / "plots" / "metrics" / "valid" / "loss.tsv", sep="\t")
    assert len(valid) == 2


def test_evaluate_writes_metrics_and_samples(built):
    metrics = json.loads(built["metrics"].read_text())
    assert metrics == built["scores"]
    assert metrics["n_test"] == 60
    assert 0.0 <= metrics["greedy"]["exact_match"] <= 1.0
    assert metrics["perplexity"] > 1.0
    greedy = metrics["greedy"]  # every wrong output is the search's fault or the model's (word-level: tokens = text)
    assert greedy["search_errors"] + greedy["model_errors"] == pytest.approx(1 - greedy["exact_match"])
    samples = pd.read_json(built["samples"], lines=True, dtype=False)
    assert list(samples.columns) == ["split", "source", "reference", "greedy", "correct", "score", "first", "worst",
                                     "reference_nll", "reference_tokens"]
    test, study = samples[samples["split"] == "test"], samples[samples["split"] == "lengths"]
    # Each reference's share of the test loss, for lib.use.compare's paired test: together, the test loss
    assert test["reference_nll"].sum() / test["reference_tokens"].sum() == pytest.approx(metrics["loss"], rel=1e-5)
    assert metrics["parameters"] > 0
    assert len(test) == 60 and test["first"].tolist() == [True] * 10 + [False] * 50  # every test example
    worst = test[test["worst"]]["score"]
    assert len(worst) == 10 and worst.max() <= test[~test["worst"]]["score"].min()
    by_length = pd.read_csv(built["lengths"])  # a plot's table, not 8 metrics
    assert list(by_length.columns) == ["length", "exact_match"] and not any("by_length" in key for key in metrics)
    assert by_length["length"].tolist() == list(range(1, 9))  # 1..vocab_length
    # Every length-study sequence, with the output by_length scored: its shares come back from the rows.
    assert len(study) == len(read_split(built["data"], "lengths"))
    assert not study["first"].any() and not study["worst"].any()  # the report's tables are test examples
    assert (study["correct"] == (study["greedy"] == study["reference"])).all()
    shares = study.groupby(study["source"].str.split().str.len())["correct"].mean()
    assert shares.tolist() == by_length["exact_match"].tolist()
    trained = test["source"].str.split().str.len()  # test sequences have the trained lengths
    assert metrics["exact_up_to_length"] == exact_up_to(shares.to_dict(), trained.min())


def disk_full_writing(monkeypatch, name: str):
    """Path.write_text fails as on a full disk for the temporary file that becomes ``name``."""
    write_text = Path.write_text

    def no_space(path, *args, **kwargs):
        if path.name.startswith(f".{name}."):  # atomic_path's temporary
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", no_space)


def test_a_full_disk_writing_the_metrics_keeps_the_last_samples_too(tmp_path, built, tiny_params, monkeypatch):
    """The samples are written first, but go into place with the metrics: new samples never sit beside the
    last run's metrics."""
    last = {name: tmp_path / built[name].name for name in ("metrics", "samples", "lengths")}
    for name, path in last.items():
        path.write_text(f"the last run's {name}")
    disk_full_writing(monkeypatch, "metrics.json")
    with pytest.raises(OSError, match=f"No space left on device: '{last['metrics']}'"):
        evaluate_families.run("cumsum", stage_config(tiny_params, "cumsum", "evaluate"), EvaluatePaths(
            data=built["data"], tokenizer=built["tokenizer"], model=built["model"], metrics=last["metrics"],
            samples=last["samples"], lengths=last["lengths"]))
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "metrics.json": "the last run's metrics", "samples.jsonl": "the last run's samples",
        "by_length.csv": "the last run's lengths"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="names a GPU this machine lacks")
def test_evaluating_on_a_gpu_that_is_not_here_names_the_param(tmp_path, built, tiny_params):
    """evaluate.device cuda without one: the param named before any work, nothing written (auto takes the CPU)."""
    outputs = tmp_path / "metrics.json", tmp_path / "samples.jsonl", tmp_path / "by_length.csv"
    tiny_params["cumsum"]["evaluate"]["device"] = "cuda"
    with pytest.raises(ValueError, match=r"^cumsum\.evaluate\.device 'cuda': no CUDA device is available here"):
        evaluate_families.run("cumsum", stage_config(tiny_params, "cumsum", "evaluate"), EvaluatePaths(
            data=built["data"], tokenizer=built["tokenizer"], model=built["model"],
            **dict(zip(("metrics", "samples", "lengths"), outputs))))
    assert not any(path.exists() for path in outputs)


def test_an_alpha_past_the_models_bound_is_named_as_the_param_before_evaluating(tmp_path, built, tiny_params):
    """An evaluate stage run after only evaluate.alpha changed (train's checks did not see it): the param is
    named, before the test and validation losses are computed (it was `alpha 1000.0: ...`, from the search).
    Greedy search has no length penalty: with beam_size 1 the same alpha is not used, and not refused."""
    outputs = tmp_path / "metrics.json", tmp_path / "samples.jsonl", tmp_path / "by_length.csv"
    tiny_params["cumsum"]["evaluate"].update(alpha=1000.0, beam_size=2)
    losses = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation, "mean_loss", lambda *args: losses.append(args) or 0.0)
        with pytest.raises(ValueError, match=re.escape(
                "cumsum.evaluate.alpha 1000.0: the length penalty ((5 + length) / 6) ** alpha overflows at this "
                "model's longest output (32 tokens) for an alpha above 48.8")):
            evaluate_families.run("cumsum", stage_config(tiny_params, "cumsum", "evaluate"), EvaluatePaths(
                data=built["data"], tokenizer=built["tokenizer"], model=built["model"],
        **dict(zip(("metrics", "samples", "lengths"), outputs))))
    assert losses == [] and not any(path.exists() for path in outputs)
    tiny_params["cumsum"]["evaluate"]["beam_size"] = 1
    metrics = evaluate_families.run("cumsum", stage_config(tiny_params, "cumsum", "evaluate"), EvaluatePaths(
        data=built["data"], tokenizer=built["tokenizer"], model=built["model"],
        **dict(zip(("metrics", "samples", "lengths"), outputs))))
    assert "beam2" not in metrics and all(path.exists() for path in outputs)


def test_a_wrong_output_is_a_search_error_only_where_the_model_scores_the_reference_higher():
    from transformer.decoding import Hypothesis
    from lib.evaluate.evaluation import search_or_model

    def h(tokens, score):
        return Hypothesis(tokens, score, score, True)

    found = [h([1, 2], -1.0), h([1, 3], -2.0), h([1, 3], -1.0), h([4], -1.0)]
    references = [h([1, 2], -1.0), h([1, 2], -1.5), h([1, 2], -3.0), h([1, 2], -1.0 + 1e-6)]  # last: a tie
    assert search_or_model(found, references) == {"search_errors": 0.25, "model_errors": 0.5}


def test_the_curves_caption_says_where_the_loss_should_start_and_where_it_can_end():
    import math

    calm = captions.curves_caption(4.3, 69, 0.0, 0.0)
    assert f"ln 69 = {math.log(69):.2f}" in calm and "Far above" not in calm and "label-smoothed" not in calm
    assert "Far above it" in captions.curves_caption(11.0, 69, 0.0, 0.0)
    assert "entropy of the smoothed targets, 0.86 nats" in captions.curves_caption(5.4, 221, 0.1, 0.864)
    # A far-too-high start names the untrained model repeating its input, and the tie, where that is why.
    tied = captions.curves_caption(4.3, 14, 0.1, 0.57, repeats=0.95, tied=True)
    assert "given at 95% of positions: its input vectors are also its output layer's rows" in tied
    assert "tie_embeddings: false starts it elsewhere" in tied
    untied = captions.curves_caption(4.3, 14, 0.1, 0.57, repeats=0.95, tied=False)
    assert "given at 95% of positions." in untied and "tie_embeddings" not in untied
    assert "given at" not in captions.curves_caption(4.3, 14, 0.1, 0.57, repeats=0.2, tied=True)


def test_a_loss_that_did_not_fall_is_told_with_what_the_learning_rate_says():
    """A run whose training loss ends near ln V (here ln 221 = 5.40) has learnt little: the report says so,
    and whether the rates summed over the run could move the weights at all (cumsum with lr_factor 0.0005:
    0.00145 in 708 steps), where the validation caption alone said only "still falling"."""
    steps = range(1, 701)

    def caption(end_loss, rates, kind="seq2seq"):
        loss = pd.DataFrame({"step": steps, "value": [5.5 + (end_loss - 5.5) * i / 699 for i in range(700)]})
        return captions.stalled_caption(loss, pd.DataFrame({"step": steps, "value": rates}), 221, kind)

    noam = [3.5e-3 * min(i / 400, (400 / i) ** 0.5) for i in steps]  # the default's warmup and decay
    assert caption(0.9, noam) == ""  # fell: nothing to say
    assert caption(4.4, noam) == ""  # 19% below ln V: it learnt something, slowly (the validation caption says)
    low = caption(5.1, [rate / 1000 for rate in noam])
    assert low.startswith("The training loss ended at 5.1")
    assert "within 10% of the 5.40 of a model that has learnt nothing" in low
    assert f"summed over the run's 700 steps, the rates come to {sum(noam) / 1000:.3g}" in low
    assert "the learning rate is too low (raise train.lr_factor)" in low and "still rising" not in low
    warming = caption(5.1, [1e-7 * i for i in steps], "lm")  # a warmup longer than the run: summed, 0.0245
    assert "too low (raise train.lr)" in warming
    assert "still rising when training stopped: its warmup (train.warmup) is longer" in warming
    assert "train longer (train.max_iters)" in warming
    high = caption(5.3, [0.05] * 700)  # summed to 35: the weights could move
    assert "enough to move the weights: a rate too high can keep the loss up" in high
    assert "lower train.lr_factor" in high and "still rising" not in high


def test_the_validation_caption_tells_falling_from_overfitting_from_a_plateau():
    def caption(values, kind="seq2seq"):
        return captions.validation_caption(pd.DataFrame({"step": range(100, 100 * len(values) + 1, 100),
                                                          "value": values}), kind)

    falling = caption([3.0, 2.0, 1.5], "lm")
    assert "lowest at step 300 (1.5000), the last, and still falling" in falling and "train.max_iters" in falling
    assert "train.epochs" in caption([3.0, 2.0, 1.5])
    assert "levelled off" in caption([3.0, 2.0, 1.999])
    overfit = caption([3.0, 2.0, 2.2, 2.5])
    assert "lowest at step 200 (2.0000); the last, at step 400, is 2.5000, +25.0%" in overfit
    assert "over-fitting" in overfit
    plateau = caption([3.0, 2.0, 2.05])
    assert "+2.5%" in plateau and "plateau" in plateau and "over-fitting" not in plateau
    assert caption([3.0]) == "" and captions.validation_caption(None, "lm") == ""


def test_the_report_says_whether_model_pt_is_one_epoch_or_an_average():
    assert captions.model_line({"step": 300, "valid_loss": 1.5}) == "Best model: step 300, validation loss 1.5000."
    averaged = captions.model_line({"step": 7130, "valid_loss": 1.57377, "averaged_epochs": 5})
    assert averaged.startswith("Model: the average of the last 5 epochs' weights, up to step 7130, validation "
                               "loss 1.5738")


def test_the_report_says_what_was_trained_and_where_its_parameters_are(built):
    text = built["report"].read_text()
    model, _, state = checkpoint.load_trained(built["model"], built["tokenizer"])
    cfg, counts = model.cfg, parameter_counts(model)
    section = text.split("## Model\n\n")[1].split("## Metrics")[0]
    assert (cfg.encoder_layers, cfg.decoder_layers) == (1, 1)  # TINY_PARAMS: "layer", not "layers"
    assert section.startswith(f"An encoder-decoder of 1 encoder and 1 decoder layer, Post-LN, as in the paper: "
                              f"d_model {cfg.d_model}, {cfg.n_heads} heads of width {cfg.d_model // cfg.n_heads}, "
                              f"a ReLU feed-forward of width {cfg.d_ff}")
    assert f"one vocabulary of {state['tgt_vocab_size']} tokens for source and target, one matrix for" in section
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| part")}
    assert rows == {part: f"{n:,}" for part, n in counts.items()}
    assert "The tied output layer's weights are the embedding's, counted there: only its bias is its own." in section
    logged = built["live"] / "plots" / "metrics"
    speed = pd.read_csv(logged / "train" / "tokens_per_s.tsv", sep="\t")
    epochs = pd.read_csv(logged / "epoch.tsv", sep="\t")["epoch"].iloc[-1]
    assert (f"Trained for {speed['step'].iloc[-1]:,} steps ({epochs} epochs), at a median "
            f"{speed['tokens_per_s'].median():,.0f} source and target tokens a second.") in section


def test_the_model_section_gives_the_mfu_when_training_measured_it(tmp_path):
    """train.peak_tflops set: the medians of the logged tokens a second and MFU; an LM has no epochs."""
    metrics = tmp_path / "plots" / "metrics" / "train"
    metrics.mkdir(parents=True)
    (metrics / "tokens_per_s.tsv").write_text("step\ttokens_per_s\n1\t900\n2\t1000\n3\t5000\n")
    (metrics / "mfu.tsv").write_text("step\tmfu\n1\t0.4\n2\t0.52\n3\t0.6\n")
    model = build_model(model_config(tie_embeddings=False, bias=False, dropout=0.2), "lm", 50, 50, True)
    lines = captions.model_section(model, {"kind": "lm", "src_vocab_size": 50, "tgt_vocab_size": 50,
                                            "joint_vocab": True}, tmp_path)
    assert lines[2] == ("A decoder-only language model of 2 layers, Post-LN, as in the paper: d_model 32, 4 heads of "
                        "width 8, a ReLU feed-forward of width 64, dropout 0.2, no biases; sinusoidal positions added "
                        "to the embeddings (sec. 3.5); a vocabulary of 50 tokens, embeddings and output layer untied.")
    assert "| output layer |        1,600 |" in lines[4] and "tied output layer" not in "".join(lines)
    assert lines[-2] == ("Trained for 3 steps, at a median 1,000 tokens a second (52% of the hardware's peak FLOPs, "
                         "train.peak_tflops).")


@pytest.mark.parametrize("norm_first", [True, False])
def test_the_architecture_sentence_names_later_models_choices(norm_first):
    cfg = model_config(n_kv_heads=1, norm="rmsnorm", activation="swiglu", positional="rope", norm_first=norm_first)
    sentence = captions.architecture(cfg, {"kind": "lm", "src_vocab_size": 50, "tgt_vocab_size": 50})
    norms = "Pre-LN with RMSNorm, and a final RMSNorm" if norm_first else "Post-LN with RMSNorm"
    assert sentence.startswith(f"A decoder-only language model of 2 layers, {norms}: d_model 32, 4 heads of width 8 "
                               "sharing 1 key/value head, a SwiGLU feed-forward of width 64, no dropout; rotary")


def test_report_links_only_existing_pngs(built):
    text = built["report"].read_text()
    assert "## Metrics" in text and "## Worst test examples" in text
    assert "| metric" in text and "| greedy" in text and "| exact_match" in text  # the search's own table
    floor = smoothed_loss_floor(checkpoint.load(built["model"])["tgt_vocab_size"], 0.1)  # TINY_PARAMS' smoothing
    assert f"entropy of the smoothed targets, {floor:.2f} nats a token here (dashed)" in text
    first = pd.read_csv(built["live"] / "plots" / "metrics" / "train" / "loss.tsv", sep="\t")["loss"].iloc[0]
    assert f"before any update, was {first:.2f} nats a token" in text
    assert "The validation loss, over 2 evaluations, was lowest at step" in text  # TINY_PARAMS: 2 epochs
    links = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    # curves, validation score, 3 heatmaps per attention example, accuracy by length, 3 heatmaps where it
    # breaks, accuracy by target value
    assert len(links) == 1 + 1 + 3 * 2 + 1 + 3 + 1
    for link in links:
        png = (built["report"].parent / link).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert width > 100 and height > 100


@pytest.mark.slow  # the report drawn four times
def test_a_report_is_drawn_whole_or_leaves_the_last_one_as_it_was(tmp_path, built, tiny_params, monkeypatch):
    """The figures go into place all at once, with report.md, after the last is drawn: a failure half way
    (or writing report.md) leaves the last report and every figure it links, and a report with fewer
    figures leaves none of the last's."""
    report, figures = tmp_path / "cumsum" / "report.md", tmp_path / "cumsum" / "figures"

    def draw(n_examples):
        tiny_params["cumsum"]["report"]["n_attention_examples"] = n_examples
        reporting.run("cumsum", stage_config(tiny_params, "cumsum", "report"), ReportPaths(
                          data=built["data"], tokenizer=built["tokenizer"], model=built["model"],
                          metrics=built["metrics"], samples=built["samples"],
                          lengths=built["lengths"], live=built["live"], out=report,
                          figures=figures, losses=tmp_path / "cumsum" / "losses.csv"))
        return {p.name: p.read_bytes() for p in figures.iterdir()}

    draw(2)
    for png in figures.iterdir():  # marked, to tell the last report's figures from ones drawn again alike
        png.write_bytes(b"the last report's " + png.name.encode())
    before, text = {p.name: p.read_bytes() for p in figures.iterdir()}, report.read_text()
    pages = {name: (report.parent / name).read_bytes() for name in ("report.html", "card.html")}

    def disk_full(*args):
        raise OSError("disk full")

    monkeypatch.setattr(sections, "plot_by_length", disk_full)
    with pytest.raises(OSError, match="disk full"):
        draw(1)  # the example figures are drawn before the accuracy by length
    assert {p.name: p.read_bytes() for p in figures.iterdir()} == before and report.read_text() == text
    assert sorted(p.name for p in report.parent.iterdir()) == ["card.html", "figures", "losses.csv", "report.html",
                                                               "report.md", "valid_score.csv"]
    monkeypatch.undo()
    disk_full_writing(monkeypatch, "report.md")  # every figure drawn, then report.md fails
    with pytest.raises(OSError, match=f"No space left on device: '{report}'"):
        draw(1)
    assert {p.name: p.read_bytes() for p in figures.iterdir()} == before and report.read_text() == text
    assert {name: (report.parent / name).read_bytes() for name in pages} == pages
    monkeypatch.undo()
    assert "cross_attention_2.png" in before and "_2.png" in text
    assert sorted(draw(1)) == sorted(name for name in before if not name.endswith("_2.png"))
    assert "_2.png" not in report.read_text()


def test_where_it_breaks_shows_a_wrong_sequence_of_that_length_and_the_steps_that_wrote_it(built):
    """The report's last attention figures: the first wrong sequence at breaking_length, and the
    model teacher-forced on its own greedy output, whose likeliest tokens are that output again: the
    rows are the steps that chose it."""
    text = built["report"].read_text()
    metrics = json.loads(built["metrics"].read_text())
    by_length = pd.read_csv(built["lengths"])
    length = breaking_length(dict(zip(by_length["length"], by_length["exact_match"])))
    assert length is not None and f"At length {length}, exact match is " in text
    assert f"up to {metrics['exact_up_to_length']} come out exact" in text
    table = text.split("## Where it breaks")[1].split("The attention that wrote")[0]
    shown = {cells[1].strip(): cells[2].strip() for row in table.splitlines() if row.startswith("| ")
             for cells in [row.split("|")] if cells[1].strip() in ("source", "reference", "greedy output")}
    assert len(shown["source"].split()) == length and shown["greedy output"] != shown["reference"]
    model, tokenizers, _ = checkpoint.load_trained(built["model"], built["tokenizer"])
    ids = tokenizer.special_ids(tokenizers)
    output = pd.DataFrame({"src": [shown["source"]], "tgt": [shown["greedy output"]]})
    pairs = tokenizer.encode_pairs(tokenizers, output)
    _, likeliest = attention_maps.attention_maps(model, collate(pairs, [0], ids), ids)
    assert likeliest[0, :-1].tolist() == pairs.tgt[0]
    stopped = len(pairs.tgt[0]) < length + TINY_PARAMS["cumsum"]["evaluate"]["max_extra_tokens"]  # not cut off
    assert (likeliest[0, -1] == ids.eos) == stopped
    assert (built["figures"] / "cross_attention_breaks.png").is_file()


def test_the_card_shows_the_headline_and_links_the_report(built):
    """card.html, which reports/index.html frames: the task's HEADLINE metrics, as its metrics.json says."""
    card = (built["report"].parent / "card.html").read_text()
    metrics = json.loads(built["metrics"].read_text())
    assert '<a href="report.html" target="_top">cumsum</a>' in card
    assert f"<td>greedy.exact_match</td><td class=num>{metrics['greedy']['exact_match']:.4f}</td>" in card
    assert f"<td>exact_up_to_length</td><td class=num>{metrics['exact_up_to_length']}</td>" in card


SAMPLE = '{"split": "test", "source": "1 2", "reference": "1 3", "greedy": "1 3", "correct": true, "score": 1.0'


@pytest.mark.parametrize("name, text, found", [
    ("metrics.json", '{"loss": ', "not JSON at line 1, column 10 (Expecting value)"),
    ("metrics.json", "[0.5]\n", "a JSON list, where the metrics are an object"),
    ("metrics.json", "\xff{}", "not UTF-8 text at byte 0"),
    ("samples.jsonl", "", "no samples"),
    ("samples.jsonl", f'{SAMPLE}, "first": true, "worst": true}}\n\n{SAMPLE}, "first": true,\n',
     "line 3: not JSON (Expecting property name enclosed in double quotes)"),
    ("samples.jsonl", f'{SAMPLE}, "first": true}}\n', "line 1: no 'worst', where a sample has split, source, "
     "reference, greedy, correct, score, first, worst"),
])
def test_an_evaluate_output_not_as_evaluate_writes_it_is_named_and_the_last_report_kept(
        tmp_path, built, tiny_params, capsys, name, text, found):
    """metrics.json or samples.jsonl cut short, edited by hand or empty: the report stage had stopped with
    json's `Expecting value: line 1 column 10 (char 9)` or pandas' `Expected object or value at position
    808449` and no file named, or with a KeyError or AttributeError and a traceback (exit 1)."""
    shutil.copytree(built["report"].parent, reports := tmp_path / "reports" / "cumsum")
    (reports / name).write_bytes(text.encode("latin-1") if "\xff" in text else text.encode())
    before = (reports / "report.md").read_bytes()
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    argv = ["cumsum", "--params", str(params), "--data", str(built["data"]), "--tokenizer", str(built["tokenizer"]),
            "--model", str(built["model"]), "--metrics", str(reports / "metrics.json"),
            "--samples", str(reports / "samples.jsonl"), "--lengths", str(built["lengths"]),
            "--live", str(reports / "train"), "--out", str(reports / "report.md"),
            "--figures", str(reports / "figures"),
            "--losses", str(reports / "losses.csv"), "--page", str(reports / "report.html"),
            "--card", str(reports / "card.html"), "--scores", str(reports / "valid_score.csv")]
    assert run_stage("report", argv) == 2
    said = last_line(capsys.readouterr().err)
    assert said == f"report@cumsum: error: {reports / name}: {found}; re-run the evaluate stage"
    assert (reports / "report.md").read_bytes() == before


def test_the_validation_score_by_epoch_is_the_score_of_that_epochs_greedy_outputs(tmp_path, built, tiny_params):
    """train.valid_score: after each epoch the exact match of the greedy valid outputs, logged and drawn; the
    decoding leaves training as it was (off, the same weights)."""
    scores = pd.read_csv(built["report"].parent / "valid_score.csv")
    assert list(scores.columns) == ["step", "epoch", "minutes", "exact_match"] and scores["epoch"].tolist() == [1, 2]
    state = checkpoint.load(built["model"])  # the best epoch's weights: its score is the one logged for it
    model, tokenizers, _ = checkpoint.load_trained(built["model"], built["tokenizer"], task="cumsum")
    valid = tokenizer.encode_pairs(tokenizers, read_split(built["data"], "valid"))
    outputs = tokenizer.decode(tokenizers.target, greedy_translate(model, valid.src, tokenizer.special_ids(tokenizers),
                                                            1024, 50))
    expected = cumsum.Cumsum().score(outputs, tokenizer.decode(tokenizers.target, valid.tgt))["exact_match"]
    assert scores.set_index("step").loc[state["step"], "exact_match"] == pytest.approx(expected)
    tiny_params["cumsum"]["train"]["valid_score"] = False
    train_into(tmp_path, tiny_params, built)
    assert not (tmp_path / "live" / "plots" / "metrics" / "valid" / "exact_match.tsv").exists()
    off, on = checkpoint.load(tmp_path / "model.pt")["model"], state["model"]
    assert all(torch.equal(off[name], on[name]) for name in on)


def test_raising_epochs_resumes_to_the_same_model(tmp_path, built, tiny_params):
    """Train 1 epoch, raise epochs to 2 and re-run: equal to 2 epochs straight. Params that only
    observe the run (the MFU's peak, how often it is saved) may change on the way."""
    train = tiny_params["cumsum"]["train"]
    train["epochs"] = 1
    train_into(tmp_path, tiny_params, built)
    train.update(epochs=2, peak_tflops="measure", checkpoint_every=train["checkpoint_every"] + 1)
    summary = train_into(tmp_path, tiny_params, built)
    assert summary["resumed"]
    resumed = checkpoint.load(tmp_path / "ckpt" / "last.pt")["model"]
    straight = checkpoint.load(built["checkpoints"] / "last.pt")["model"]
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    mfu = pd.read_csv(tmp_path / "live" / "plots" / "metrics" / "train" / "mfu.tsv", sep="\t")["mfu"]
    assert len(mfu) == summary["step"] // 2 and (mfu > 0).all() and (mfu < 1).all()  # the second epoch's steps


def test_max_steps_stops_mid_epoch_and_raising_it_resumes_to_the_same_model(tmp_path, built, tiny_params,
                                                                            caplog):
    """train.max_steps (the paper's unit): the run stops at that step inside an epoch, validated, with a
    model.pt; lifting the bound finishes the epoch where it stopped, to the weights of a run never stopped."""
    straight = checkpoint.load(built["checkpoints"] / "last.pt")
    per_epoch = straight["step"] // tiny_params["cumsum"]["train"]["epochs"]
    tiny_params["cumsum"]["train"]["max_steps"] = per_epoch // 2
    with caplog.at_level(logging.INFO, logger="lib.train.seq2seq"):
        summary = train_into(tmp_path, tiny_params, built)
    stopped = checkpoint.load(tmp_path / "ckpt" / "last.pt")
    assert summary["step"] == per_epoch // 2 and stopped["epoch"] == 0 and stopped["batches_done"] == per_epoch // 2
    assert f"stopped: trained {per_epoch // 2} steps (train.max_steps)" in caplog.text
    assert checkpoint.load(tmp_path / "model.pt")["step"] == per_epoch // 2  # validated at the stop
    assert not list((tmp_path / "ckpt").glob("epoch-*.pt"))  # no epoch ended
    tiny_params["cumsum"]["train"]["max_steps"] = 0
    summary = train_into(tmp_path, tiny_params, built)
    assert summary["resumed"] and summary["step"] == straight["step"]
    resumed = checkpoint.load(tmp_path / "ckpt" / "last.pt")
    assert resumed["epoch"] == straight["epoch"]
    assert all(torch.equal(resumed["model"][k], straight["model"][k]) for k in straight["model"])


@pytest.mark.parametrize("averaged_loss, model_loss, average", [(9.0, 2.0, "if_better"), (1.0, 1.0, "if_better"),
                                                                (9.0, 9.0, "always")])
def test_model_pt_is_the_best_epoch_or_a_better_average(tmp_path, built, tiny_params, monkeypatch, caplog,
                                                         averaged_loss, model_loss, average):
    """Validation losses 3, 2, 2.5, 2.6 (scripted): patience 2 stops training after the fourth epoch, and
    model.pt is the second's weights, unless the average of the last two validates better still; with
    train.average always (the paper's), the average whatever it validates."""
    losses = iter([3.0, 2.0, 2.5, 2.6, averaged_loss])
    for module in (seq2seq, averaging):  # the epochs' validation, then the average's
        monkeypatch.setattr(module, "mean_loss", lambda *args: next(losses))
    tiny_params["cumsum"]["train"].update(epochs=10, patience=2, average_last=2, average=average)
    with caplog.at_level("INFO", logger="lib"):
        summary = train_into(tmp_path, tiny_params, built)
    assert "stopped: no better validation loss for 2 epochs (train.patience)" in caplog.text
    assert next(losses, None) is None and summary["best_valid_loss"] == 2.0
    model, best = checkpoint.load(tmp_path / "model.pt"), checkpoint.load(tmp_path / "ckpt" / "best.pt")
    assert model["valid_loss"] == model_loss and best["valid_loss"] == 2.0 and best["step"] < summary["step"]
    assert model.get("averaged_epochs") == (2 if averaged_loss < 2.0 or average == "always" else None)


def test_averaging_by_steps_is_the_mean_of_the_last_weights_saved_every_n_steps(tmp_path, built, tiny_params,
                                                                                 monkeypatch):
    """train.average_every: weights kept every N steps, the last average_last of them, and model.pt their
    mean when it validates better (the paper's checkpoints every 10 minutes, where an epoch is too long)."""
    losses = iter([3.0, 2.0, 1.0])  # epoch 1, epoch 2, then the average: better, so model.pt is the average
    for module in (seq2seq, averaging):  # the epochs' validation, then the average's
        monkeypatch.setattr(module, "mean_loss", lambda *args: next(losses))
    tiny_params["cumsum"]["train"].update(epochs=2, average_every=3, average_last=3)
    summary = train_into(tmp_path, tiny_params, built)
    last = summary["step"] // 3 * 3
    kept = sorted(int(path.stem.split("-")[1]) for path in (tmp_path / "ckpt").glob("step-*.pt"))
    assert kept == [last - 6, last - 3, last]
    saved = [checkpoint.load(tmp_path / "ckpt" / f"step-{s}.pt")["model"] for s in kept]
    model = checkpoint.load(tmp_path / "model.pt")
    assert model["averaged_checkpoints"] == 3 and model["average_every"] == 3 and model["valid_loss"] == 1.0
    for name, weights in model["model"].items():
        mean = sum(state[name].double() for state in saved) / 3
        assert torch.equal(weights, mean.to(weights.dtype)), name
    assert captions.model_line(model).startswith("Model: the average of the last 3 checkpoints' weights (one "
                                                 "every 3 steps)")


def test_the_checkpoints_averaged_end_at_max_steps(tmp_path):
    """train.average_every counted back from max_steps (the paper's 100,000 is no multiple of 1,400): the last
    weights averaged are the final step's; without max_steps, every N steps from the start."""
    def kept(**train) -> list[int]:
        cfg = SimpleNamespace(**{"max_steps": 0, **train})
        return [step for step in range(1, 22) if averaging.averaging_step(cfg, step)]

    assert kept(average_every=5, max_steps=21) == [1, 6, 11, 16, 21]
    assert kept(average_every=5) == [5, 10, 15, 20]
    for step in range(1, 22):
        (tmp_path / f"step-{step}.pt").touch()
    cfg = SimpleNamespace(average_every=5, max_steps=21, average_last=3)
    for step, last in ((21, [21, 16, 11]), (19, [16, 11, 6])):  # stopped early (a time budget): the last kept
        run = SimpleNamespace(state={"step": step}, checkpoint_dir=tmp_path)
        paths, unit = averaging.averaged_paths(run, cfg)
        assert [int(path.stem.split("-")[1]) for path in paths] == last and unit == "checkpoints"


def test_every_epoch_shuffles_the_batches_anew(tmp_path, built, tiny_params, monkeypatch):
    """Epoch e's batches come from train.seed and e: the same pairs each epoch, grouped and ordered anew."""
    drawn = []

    def recorded(pairs, max_tokens, generator=None, unit="padded"):
        batches = token_budget_batches(pairs, max_tokens, generator, unit)
        if generator is not None:  # training's (validation takes its batches in a fixed order)
            drawn.append(batches)
        return batches

    monkeypatch.setattr(seq2seq, "token_budget_batches", recorded)
    tiny_params["cumsum"]["train"]["epochs"] = 2
    train_into(tmp_path, tiny_params, built)
    first, second = drawn
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(len(sum(first, []))))


def test_accumulating_two_batches_is_one_step_on_both(tmp_path, built, tiny_params, monkeypatch):
    """train.accumulate: 2 over the epoch's batches b1, b2, b3, ... takes the steps that single batches
    b1 + b2, b3 + b4, ... take: the same weights, losses and gradient norms (dropout off: its masks
    follow the batches' shapes)."""
    make_batches = seq2seq.token_budget_batches
    train = tiny_params["cumsum"]["train"]
    train["model"]["dropout"] = 0.0
    train["accumulate"] = 2
    summary = train_into(tmp_path / "accumulated", tiny_params, built)

    def pairs_joined(*args):
        batches = make_batches(*args)
        return [sum(batches[i:i + 2], []) for i in range(0, len(batches), 2)]

    monkeypatch.setattr(seq2seq, "token_budget_batches", pairs_joined)
    train["accumulate"] = 1
    joined = train_into(tmp_path / "joined", tiny_params, built)
    # Half the steps of the built run's single batches (the same epochs), rounded up each epoch.
    assert summary["step"] == joined["step"] < built["summary"]["step"] <= 2 * summary["step"]
    weights = [checkpoint.load(tmp_path / d / "ckpt" / "last.pt")["model"] for d in ("accumulated", "joined")]
    for name, weight in weights[1].items():
        if name.endswith("qkv_proj.bias"):  # the keys' third has a zero gradient: rounding noise (see above)
            weight, weights[0][name] = weight.view(3, -1)[[0, 2]], weights[0][name].view(3, -1)[[0, 2]]
        torch.testing.assert_close(weights[0][name], weight, rtol=1e-5, atol=1e-6, msg=name)
    for curve in ("loss", "grad_norm", "lr"):
        logged = [pd.read_csv(tmp_path / d / "live" / "plots" / "metrics" / "train" / f"{curve}.tsv", sep="\t")
                  for d in ("accumulated", "joined")]
        assert list(logged[0]["step"]) == list(logged[1]["step"])
        torch.testing.assert_close(torch.tensor(logged[0][curve].values), torch.tensor(logged[1][curve].values),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # torch.compile
def test_compiled_training_trains_the_same_model(tmp_path, built, tiny_params, monkeypatch):
    """train.compile: the same weights as eager training, through compiled graphs without a break.
    Dropout off: compiled, a CPU draws torch's dropout masks rather than ours. The aot_eager
    backend traces the same forward and backward graphs as the default, inductor, and runs them
    as they are, where inductor's C++ build would take a minute on 2 cores."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    train = tiny_params["cumsum"]["train"]
    train["epochs"] = 1
    train["model"]["dropout"] = 0.0
    train_into(tmp_path / "eager", tiny_params, built)
    train["compile"] = True
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    counters.clear()
    compilation_time_metrics.clear()
    with torch_compile_defaults():
        train_into(tmp_path / "compiled", tiny_params, built)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    # Each graph traced once: a restarted trace (a float input that a kernel needs as a constant) costs a third more.
    assert "compile_attempt_1" not in compilation_time_metrics, sorted(compilation_time_metrics)
    eager, compiled = (checkpoint.load(tmp_path / d / "ckpt" / "last.pt")["model"] for d in ("eager", "compiled"))
    for name, weight in eager.items():
        if name.endswith("qkv_proj.bias"):  # (queries, keys, values): all but the keys' third
            # A key bias adds q . b to all of a query's scores, which the softmax cancels: its gradient
            # is zero but for rounding, which Adam (eps 1e-9) scales up to whole steps, so it wanders
            # differently under any other kernels (here by ~0.03) and changes no output.
            weight, compiled[name] = weight.view(3, -1)[[0, 2]], compiled[name].view(3, -1)[[0, 2]]
        torch.testing.assert_close(compiled[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def test_changed_params_start_afresh(tmp_path, built, tiny_params):
    tiny_params["cumsum"]["train"]["epochs"] = 1
    train_into(tmp_path, tiny_params, built)
    tiny_params["cumsum"]["train"]["lr_factor"] = 0.5
    summary = train_into(tmp_path, tiny_params, built)
    assert not summary["resumed"]


@pytest.mark.slow  # a trainer killed, its own process
def test_killed_training_resumes_bit_identical(tmp_path, built, tiny_params):
    """kill -9 the train stage part-way; the re-run resumes and ends where a straight run ends. Two
    batches a step (train.accumulate), so that the checkpoint falls between steps within an epoch."""
    train = tiny_params["cumsum"]["train"]
    train.update(epochs=3, checkpoint_every=2, accumulate=2)
    train["model"].update(d_model=32, d_ff=64)  # slow enough to be killed mid-run
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))

    def command(out):
        return [sys.executable, "-m", "stages.train", "cumsum", "--params", str(params),
                "--data", str(built["data"]), "--tokenizer", str(built["tokenizer"]),
                "--model", str(out / "model.pt"), "--checkpoints", str(out / "ckpt"), "--live", str(out / "live")]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train_into(straight, tiny_params, built)
    process = subprocess.Popen(command(killed), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (killed / "ckpt" / "last.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    interrupted = checkpoint.load(killed / "ckpt" / "last.pt")
    assert interrupted["epoch"] < 3, "the run finished before it could be killed"
    assert interrupted["batches_done"] > 0, "killed between epochs: nothing resumed inside one"
    (killed / "ckpt" / ".last.pt.k1ll3d.tmp").write_bytes(b"half a checkpoint")  # as a kill mid-save leaves
    with open(killed / "live" / "plots" / "metrics" / "train" / "loss.tsv", "a") as tsv:
        tsv.write("1")  # as a full disk leaves a row: "1" of "13\t2.71", read as step 1 with no loss

    result = subprocess.run(command(killed), cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"resuming from {killed / 'ckpt' / 'last.pt'} at step {interrupted['step']}" in result.stderr
    a, b = checkpoint.load(straight / "model.pt"), checkpoint.load(killed / "model.pt")
    assert a["step"] == b["step"] and a["valid_loss"] == b["valid_loss"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    curve = lambda d: pd.read_csv(d / "live" / "plots" / "metrics" / "train" / "loss.tsv", sep="\t")  # noqa: E731 - a one-line helper, named where it is used
    assert curve(killed)["step"].tolist() == curve(straight)["step"].tolist()
    assert curve(killed)["loss"].tolist() == curve(straight)["loss"].tolist()
    assert not list(killed.rglob("*.tmp"))  # the resumed run cleared it


def test_a_curve_cut_short_is_trimmed_to_its_finished_lines_on_resume(tmp_path):
    metrics = tmp_path / "plots" / "metrics" / "train"
    metrics.mkdir(parents=True)
    (metrics / "loss.tsv").write_text("step\tloss\n0\t4.1\n1\t3.9\n2\t3.5\n3\t3.2\n1")
    (metrics / "lr.tsv").write_text("ste")  # not even its header: dvclive writes one with its next row
    curves.truncate_curves(tmp_path, 2)
    assert (metrics / "loss.tsv").read_text() == "step\tloss\n0\t4.1\n1\t3.9\n2\t3.5\n"
    assert sorted(p.name for p in metrics.iterdir()) == ["loss.tsv"]


def last_line(stderr: str) -> str:
    """What a terminal shows last of ``stderr``: the text after its last carriage return or newline. A
    progress bar not cleared before the stage's message would show in front of it, or after it."""
    assert stderr.endswith("\n"), repr(stderr[-200:])
    return re.split(r"[\r\n]", stderr[:-1])[-1]


@pytest.mark.slow  # a trainer signalled, its own process
@pytest.mark.parametrize("sent, status, said", [(signal.SIGINT, 130, "interrupted"),
                                               (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_sigterm_is_one_line_and_keeps_the_checkpoint(tmp_path, built, tiny_params, sent, status,
                                                                 said):
    """SIGINT (Ctrl-C) or SIGTERM (kill, a scheduler) part-way through training: exit status 128 + the signal,
    one line instead of a traceback or nothing, last.pt whole, no temporary file left."""
    train = tiny_params["cumsum"]["train"]
    train.update(epochs=50, checkpoint_every=4)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "stages.train", "cumsum", "--params", str(params), "--data", str(built["data"]),
         "--tokenizer", str(built["tokenizer"]), "--model", str(out / "model.pt"), "--checkpoints",
         str(out / "ckpt"), "--live", str(out / "live")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # A shell's background job (how CI may run this) ignores SIGINT, and a child inherits that: restore it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (out / "ckpt" / "last.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(sent)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == status, stderr
    assert last_line(stderr) == (f"train@cumsum: {said}; nothing was left half-written, and a re-run resumes from "
                                 "the last checkpoint")
    assert "Traceback" not in stderr
    assert checkpoint.load(out / "ckpt" / "last.pt")["epoch"] < 50
    assert not (out / "model.pt").exists() and not list(out.rglob("*.tmp"))


@pytest.mark.parametrize("log_every, checkpoint_every", [(1, 1), (2, 2)])
def test_divergence_stops_with_the_step_and_keeps_the_checkpoint(tmp_path, capsys, built, tiny_params, log_every,
                                                                 checkpoint_every):
    """Read back every step, or every 2nd (the steps between left on the device, a non-finite one skipped
    there): the error names the step, and no checkpoint holds a NaN."""
    train = tiny_params["cumsum"]["train"]
    train.update(epochs=3, lr_factor=1e30, checkpoint_every=checkpoint_every, log_every=log_every)  # absurd
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    assert run_stage("train", ["cumsum", "--params", str(params), "--data", str(built["data"]),
                               "--tokenizer", str(built["tokenizer"]), "--model", str(tmp_path / "model.pt"),
                               "--checkpoints", str(tmp_path / "ckpt"), "--live", str(tmp_path / "live")]) == 2
    stderr = last_line(capsys.readouterr().err)
    assert stderr.startswith("train@cumsum: error: training diverged at step") and "train.lr_factor" in stderr
    assert not (tmp_path / "model.pt").exists()
    if log_every == 1:  # read back at once: a checkpoint after step 1 was written before the bad step
        assert (tmp_path / "ckpt" / "last.pt").is_file()
    for saved in (tmp_path / "ckpt").glob("*.pt"):  # still loads, and holds no NaN
        assert all(torch.isfinite(t).all() for t in checkpoint.load(saved)["model"].values()), saved


@pytest.mark.parametrize("writing, code", [("best.pt", errno.ENOSPC), ("curves", errno.ENOSPC),
                                           ("best.pt", errno.EIO)])
def test_a_full_disk_is_one_line_naming_the_output_and_keeps_the_checkpoint(tmp_path, capsys, built, tiny_params,
                                                                           monkeypatch, writing, code):
    """What the machine refuses (here a full disk, as the best weights or the training curves are written) is
    the user's to fix: one line that names the output, as a bad param is. Another OSError (an I/O error) is
    not foreseen: its traceback."""
    save = torch.save

    def save_until_the_best(obj, file):
        if ".best.pt." in file.name:
            file.write(b"the first bytes")
            raise OSError(code, os.strerror(code))
        save(obj, file)

    def no_space(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    if writing == "best.pt":
        monkeypatch.setattr(torch, "save", save_until_the_best)
    else:
        monkeypatch.setattr(dvclive.Live, "log_metric", no_space)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    argv = ["cumsum", "--params", str(params), "--data", str(built["data"]), "--tokenizer", str(built["tokenizer"]),
            "--model", str(tmp_path / "model.pt"), "--checkpoints", str(tmp_path / "ckpt"),
            "--live", str(tmp_path / "live")]
    refused = code == errno.ENOSPC
    with contextlib.nullcontext() if refused else pytest.raises(OSError, match="Input/output error"):
        assert run_stage("train", argv) == 2
    named = tmp_path / "ckpt" / "best.pt" if writing == "best.pt" else tmp_path / "live"
    if refused:
        said = last_line(capsys.readouterr().err)
        assert said == f"train@cumsum: error: [Errno 28] No space left on device: '{named}'"
    assert not (tmp_path / "model.pt").exists() and not list(tmp_path.rglob("*.tmp"))
    if writing == "best.pt":
        assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["last.pt"]
        assert checkpoint.load(tmp_path / "ckpt" / "last.pt")["model"]


OUT_OF_MEMORY = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
                 "1.31 GiB is free. If reserved but unallocated memory is large try setting "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")  # torch's text


def test_a_gpu_out_of_memory_names_what_sizes_a_batch(tmp_path, capsys, built, tiny_params, monkeypatch):
    """A GPU's torch.OutOfMemoryError (here raised where the loss is computed) is the user's to fix, as a bad
    param is: one line naming the param that sizes a batch and how to keep the update, not torch's traceback."""
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError(OUT_OF_MEMORY)

    monkeypatch.setattr(seq2seq, "seq2seq_loss", out_of_memory)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    argv = ["cumsum", "--params", str(params), "--data", str(built["data"]), "--tokenizer", str(built["tokenizer"]),
            "--model", str(tmp_path / "model.pt"), "--checkpoints", str(tmp_path / "ckpt"),
            "--live", str(tmp_path / "live")]
    assert run_stage("train", argv) == 2
    max_tokens = tiny_params["cumsum"]["train"]["max_tokens"]
    assert last_line(capsys.readouterr().err) == (
        f"train@cumsum: error: CUDA out of memory. Tried to allocate 2.00 GiB: a batch is train.max_tokens "
        f"{max_tokens} padded tokens a side; halve it and double train.accumulate (now 1): an update sees as "
        "many tokens, in half the memory; or make train.model smaller")
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize("name, load, message", [
    ("model.pt", checkpoint.load, "not a readable checkpoint"),
    ("tokenizer.json", tokenizer.load_tokenizer, "not a readable"),
    ("source.json", tokenizer.load_tokenizer, "not a readable"),
    ("train.parquet", lambda path: read_split(path.parent, "train"), r"not a readable split \(ArrowInvalid\)"),
    ("valid.txt", lambda path: read_text(path.parent, "valid"), "not UTF-8 text at byte 0; re-run the prepare"),
])
def test_corrupt_artifact_is_named(tmp_path, name, load, message):
    bad = tmp_path / name
    bad.write_bytes(b"\xffgarbage{" * 20)
    with pytest.raises(ValueError, match=rf"{name}: {message}"):
        load(bad)


class MakesADirectory:
    """What a pickle can hold besides tensors and plain data: a call, made as the file is read."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (str(self.path),)


def test_a_checkpoint_that_would_run_code_as_it_is_read_is_refused_and_not_run(tmp_path):
    """A model file pulled from a DVC remote, or handed over, is data, not a program: torch.load's full
    unpickling makes whatever call the file names; checkpoint.load reads tensors and plain data only."""
    ran = tmp_path / "ran"
    torch.save({"model": {}, "extra": MakesADirectory(ran)}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"model.pt: not a readable checkpoint .*UnpicklingError"):
        checkpoint.load(tmp_path / "model.pt")
    assert not ran.exists()


def test_model_and_tokenizer_from_different_runs_are_named(tmp_path, built, tiny_params):
    """evaluate, report and lib.use.generate load both through one helper, which compares the vocabularies."""
    tiny_params["cumsum"]["tokenize"]["kind"] = "char"  # another vocabulary from the same data
    run_tokenize("cumsum", stage_config(tiny_params, "cumsum", "tokenize"), built["data"], tmp_path / "tok")
    message = r"model.pt was trained with vocabularies of (\d+) \(source\) and \1 \(target\) tokens, " \
              r"but .*tok has \d+ and \d+: they come from different runs"
    with pytest.raises(ValueError, match=message):
        checkpoint.load_trained(built["model"], tmp_path / "tok")
    model, tokenizers, state = checkpoint.load_trained(built["model"], built["tokenizer"])
    assert state["tgt_vocab_size"] == tokenizers.target.get_vocab_size() and not model.training


def test_a_model_of_another_task_is_named(tmp_path, built, capsys):
    """cumsum's model and tokenizer agree with each other, so only the task recorded in model.pt tells
    evaluate, report and lib.use.generate that multi30k was asked for (it would "translate" German into digits)."""
    from lib.use import generate

    state = checkpoint.load(built["model"])
    assert state["task"] == "cumsum"
    message = r"model.pt was trained for the cumsum task, not multi30k: name the task it was trained for"
    cfg = lambda stage: stage_config(TINY_PARAMS, "cumsum", stage)  # noqa: E731 - a one-line helper, named where it is used
    out = {name: tmp_path / name for name in ("metrics.json", "samples.jsonl", "by_length.csv", "report.md",
                                              "figures", "losses.csv")}
    with pytest.raises(ValueError, match=message):
        evaluate_families.run("multi30k", cfg("evaluate"), EvaluatePaths(
            data=built["data"], tokenizer=built["tokenizer"], model=built["model"], metrics=out["metrics.json"],
            samples=out["samples.jsonl"], lengths=out["by_length.csv"]))
    with pytest.raises(ValueError, match=message):
        reporting.run("multi30k", cfg("report"), ReportPaths(
                          data=built["data"], tokenizer=built["tokenizer"], model=built["model"],
                          metrics=built["metrics"], samples=built["samples"],
                          lengths=built["lengths"], live=built["live"],
                          out=out["report.md"], figures=out["figures"],
                          losses=out["losses.csv"]))
    assert not any(path.exists() for path in out.values())
    (tmp_path / "de.txt").write_text("Ein Hund läuft.\n")
    with pytest.raises(SystemExit) as exit_info:
        generate.main(["--task", "multi30k", "--models", str(built["model"].parent),
                       "--input", str(tmp_path / "de.txt")])
    assert exit_info.value.code == 2 and re.search(message, capsys.readouterr().err)
    del state["task"]  # a model file from before the task was recorded is taken
    torch.save(state, tmp_path / "model.pt")
    assert checkpoint.load_trained(tmp_path / "model.pt", built["tokenizer"], task="multi30k")[2]["kind"] == "seq2seq"


def test_a_directory_is_replaced_whole_or_left_as_it_was(tmp_path, monkeypatch):
    """prepare and tokenize write a directory each: the new one goes into place by rename, and where that
    fails (a full disk, Ctrl-C between the two renames) the previous one is put back whole."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("the earlier data")
    rename = type(data).rename

    def failing_rename(self, target):
        if self.name == ".data.tmp":
            raise OSError("no space left on device")
        return rename(self, target)

    monkeypatch.setattr(type(data), "rename", failing_rename)
    with pytest.raises(OSError, match="no space left"), files.atomic_dir(data, ("*.txt",), "the prepare stage") as tmp:
        (tmp / "train.txt").write_text("the new data")
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # nothing aside, nothing half-written
    assert (data / "train.txt").read_text() == "the earlier data"

    monkeypatch.setattr(type(data), "rename", rename)
    with files.atomic_dir(data, ("*.txt",), "the prepare stage") as tmp:
        (tmp / "train.txt").write_text("the new data")
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
    assert (data / "train.txt").read_text() == "the new data"


def test_a_directory_holding_what_its_writer_does_not_write_is_not_replaced(tmp_path):
    """atomic_dir itself, under every command that writes a folder, refuses one holding anything its writer
    does not write, naming the folder and the file, before anything is made beside it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("the earlier data")
    (data / "thesis.txt").write_text("the user's own")
    with pytest.raises(ValueError, match=rf"^{data}: holds thesis.txt, which the prepare stage does not write"):
        with files.atomic_dir(data, ("train.txt", "valid.txt"), "the prepare stage") as tmp:
            (tmp / "train.txt").write_text("the new data")
    assert on_disk(tmp_path) == {"data": None, "data/train.txt": "the earlier data",
                                 "data/thesis.txt": "the user's own"}


def on_disk(root: Path) -> dict[str, str | None]:
    """Every path under ``root`` with its text (None: a directory)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_text() for p in sorted(root.rglob("*"))}


STAGES = {stage: importlib.import_module(f"stages.{stage}") for stage in ["fetch", "prepare", "tokenize", "train",
                                                                          "evaluate", "report"]}


@pytest.mark.parametrize("stage, option", [(stage, option) for stage, module in STAGES.items()
                                           for option in module.WRITES])
@pytest.mark.parametrize("in_the_way", ["at the path", "above it"])
def test_an_output_that_cannot_be_written_is_named_before_any_work(tmp_path, capsys, stage, option, in_the_way):
    """A directory where a stage writes a file, or a file where it writes a directory or where a directory
    above either is needed, stops the stage before it reads anything (none of its inputs exist here): one
    line, naming the option and the path, exit status 2, and the user's file or directory kept as it was."""
    module = STAGES[stage]
    paths = {name: tmp_path / name for name in [*module.READS, *module.WRITES]}
    writes_a_directory = module.WRITES[option] == DIRECTORY
    if in_the_way == "above it":
        (tmp_path / "notes").write_text("the user's notes")
        paths[option] = tmp_path / "notes" / option
        problem = f"{tmp_path / 'notes'} is a file, where a directory is needed"
    elif writes_a_directory:
        paths[option].write_text("the user's notes")
        problem = "a file is there, where a directory is written"
    else:
        paths[option].mkdir()
        (paths[option] / "notes").write_text("the user's notes")
        problem = "a directory is there, where a file is written"
    before = on_disk(tmp_path)
    argv = ["cumsum", "--params", str(ROOT / "params.yaml")]
    assert run_stage(stage, argv + [arg for name, path in paths.items() for arg in (f"--{name}", str(path))]) == 2
    assert capsys.readouterr().err == (f"{stage}@cumsum: error: --{option} {paths[option]}: {problem} (move it or "
                                       "name another path)\n")
    assert on_disk(tmp_path) == before


@pytest.mark.parametrize("stage, option", [*TASK_DIRECTORIES, *HOLDS])
def test_a_directory_output_holding_what_the_stage_does_not_write_is_refused(tmp_path, capsys, stage, option):
    """A stage replaces a directory it writes whole (training started afresh clears its checkpoints and
    curves), so `tokenize --out models/cumsum`, meant for models/cumsum/tokenizer, deleted the trained model
    and its checkpoints, exit 0. A directory that holds anything the stage does not write there stops it
    before any work (none of its inputs exist here): one line naming what would be lost, exit status 2, the
    directory as it was."""
    module = STAGES[stage]
    paths = {name: tmp_path / name for name in [*module.READS, *module.WRITES]}
    paths[option].mkdir()
    (paths[option] / "source.txt").write_text("a text source, copied in")  # prepare writes texts, but not this one
    (paths[option] / "notes.md").write_text("the user's notes")
    (paths[option] / "old").mkdir()
    before = on_disk(tmp_path)
    argv = ["cumsum", "--params", str(ROOT / "params.yaml")]
    assert run_stage(stage, argv + [arg for name, path in paths.items() for arg in (f"--{name}", str(path))]) == 2
    assert capsys.readouterr().err == (
        f"{stage}@cumsum: error: --{option} {paths[option]}: holds notes.md, old/, source.txt, which the {stage} stage "
        "does not write; it replaces the directory whole, so those would be lost (move them or name another path)\n")
    assert on_disk(tmp_path) == before


def test_every_directory_a_stage_wrote_is_one_it_may_write_again(built):
    """What the stages wrote (cumsum's; the LM's and multi30k's in their tests) is what holds() lets them replace."""
    outputs = {("fetch", "out"): built["sources"], ("prepare", "out"): built["data"],
               ("tokenize", "out"): built["tokenizer"],
               ("train", "checkpoints"): built["checkpoints"], ("train", "live"): built["live"],
               ("report", "figures"): built["figures"]}
    assert set(outputs) == {*TASK_DIRECTORIES, *HOLDS} == {(stage, option) for stage, module in STAGES.items()
                                          for option, kind in module.WRITES.items() if kind == DIRECTORY}
    check_rerunnable(outputs)


@pytest.mark.parametrize("stage, option", [(stage, option) for stage, module in STAGES.items()
                                           for option in module.READS])
@pytest.mark.parametrize("wrong", ["missing", "of the other kind"])
def test_an_input_that_is_not_there_is_named_with_the_stage_that_writes_it(tmp_path, capsys, stage, option,
                                                                          wrong):
    """A stage run by hand (dvc repro checks its dependencies itself) whose input is missing, or is a file
    where a directory is read or the reverse, says so before any work: the option, the path, and for a
    missing one the stage to run; exit status 2, nothing written. Before, a missing --data was a bare
    "[Errno 2] No such file or directory" after the model was built, and a missing --live a TypeError
    traceback from the report's plotting."""
    module = STAGES[stage]
    paths = {name: tmp_path / name for name in [*module.READS, *module.WRITES]}

    def make(path, kind):  # an empty one: nothing the stage could use
        path.mkdir() if kind == DIRECTORY else path.write_text("")

    for name in module.READS:
        if name != option:
            make(paths[name], INPUTS[name][0])
    kind, writer = INPUTS[option]
    if wrong == "missing":
        problem = f"not found (run the {writer} stage first)"
    else:
        other = FILE if kind == DIRECTORY else DIRECTORY
        make(paths[option], other)
        problem = f"a {other} is there, where a {kind} is read"
    before = on_disk(tmp_path)
    argv = ["cumsum", "--params", str(ROOT / "params.yaml")]
    assert run_stage(stage, argv + [arg for name, path in paths.items() for arg in (f"--{name}", str(path))]) == 2
    assert capsys.readouterr().err == f"{stage}@cumsum: error: --{option} {paths[option]}: {problem}\n"
    assert on_disk(tmp_path) == before


def test_a_report_from_a_directory_without_training_curves_names_the_curve(tmp_path, built, tiny_params):
    (tmp_path / "live").mkdir()
    with pytest.raises(FileNotFoundError, match=r"live/plots/metrics/train/loss.tsv: training curve not found "
                                                r"\(run the train stage first\)"):
        reporting.run("cumsum", stage_config(tiny_params, "cumsum", "report"), ReportPaths(
                          data=built["data"], tokenizer=built["tokenizer"], model=built["model"],
                          metrics=built["metrics"], samples=built["samples"],
                          lengths=built["lengths"], live=tmp_path / "live", out=tmp_path /
                          "report.md", figures=tmp_path / "figures", losses=tmp_path /
                          "losses.csv"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live"]


def test_a_file_is_not_written_over_a_directory(tmp_path):
    """What a stage checks first, ``atomic_path`` checks too, for a caller that did not."""
    (tmp_path / "model.pt").mkdir()
    with pytest.raises(ValueError, match="model.pt: a directory is there, where a file is written"):
        with files.atomic_path(tmp_path / "model.pt") as tmp:
            tmp.write_text("weights")
    assert on_disk(tmp_path) == {"model.pt": None}


@pytest.mark.parametrize("fails", [False, True])
def test_a_directory_set_aside_by_a_killed_run_is_put_back(tmp_path, fails):
    """A kill between the two renames leaves the previous directory aside and none in place: the next
    run puts it back first, so that an error in that run too leaves the user's data where it was."""
    data, aside = tmp_path / "data", tmp_path / ".data.previous"
    aside.mkdir()
    (aside / "train.txt").write_text("the earlier data")
    refused = pytest.raises(ValueError) if fails else contextlib.nullcontext()
    with refused, files.atomic_dir(data, ("*.txt",), "the prepare stage") as tmp:
        if fails:
            raise ValueError("bad params")
        (tmp / "train.txt").write_text("the new data")
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
    assert (data / "train.txt").read_text() == ("the earlier data" if fails else "the new data")


def test_split_without_its_columns_is_named(tmp_path):
    pd.DataFrame({"source": ["1 2"], "target": ["1 3"]}).to_parquet(tmp_path / "test.parquet")
    with pytest.raises(ValueError, match=r"test.parquet: expected columns src and tgt, found \['source', 'target'\]"):
        read_split(tmp_path, "test")


def test_unreadable_last_checkpoint_says_how_to_start_afresh(tmp_path, built, tiny_params):
    """A corrupt last.pt would stop every re-run the same way, so the message gives the way out instead
    of "re-run the train stage", and the file is left for the user to look at."""
    shutil.copytree(built["checkpoints"], tmp_path / "ckpt")
    (tmp_path / "ckpt" / "last.pt").write_bytes(b"\x00garbage{" * 20)
    message = r"last\.pt: not a readable checkpoint .*; delete .*ckpt to train from the start"
    with pytest.raises(ValueError, match=message):
        train_into(tmp_path, tiny_params, built)
    assert (tmp_path / "ckpt" / "last.pt").read_bytes() == b"\x00garbage{" * 20
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize("best", ["corrupt", "missing"])
def test_an_unreadable_best_checkpoint_is_named_before_a_resumed_run_trains(tmp_path, built, tiny_params, best):
    """The train stage copies best.pt into model.pt byte for byte: a corrupt one had become an unreadable model.pt
    after the resumed run trained (exit 0), and each re-run copied it again, so that evaluate's "re-run the train
    stage" could not mend it; a missing one had been a FileNotFoundError once training was done."""
    shutil.copytree(built["checkpoints"], tmp_path / "ckpt")
    shutil.copytree(built["live"], tmp_path / "live")
    if best == "corrupt":
        (tmp_path / "ckpt" / "best.pt").write_bytes(b"\x00garbage{" * 20)
        message = r"best\.pt: not a readable checkpoint .*; delete .*ckpt to train from the start"
    else:
        (tmp_path / "ckpt" / "best.pt").unlink()
        message = r"best\.pt: not found, though .*last\.pt has validated; delete .*ckpt to train from the start"
    last = (tmp_path / "ckpt" / "last.pt").read_bytes()
    tiny_params["cumsum"]["train"]["epochs"] += 1
    with pytest.raises(ValueError, match=message):
        train_into(tmp_path, tiny_params, built)
    assert (tmp_path / "ckpt" / "last.pt").read_bytes() == last  # before a step
    assert not (tmp_path / "model.pt").exists()


def test_a_resume_drops_an_unreadable_summary_and_curve_rows_with_a_warning(tmp_path, built, tiny_params, caplog):
    """dvclive rewrites metrics.json in place at each validation: a full disk or a kill mid-write leaves it
    empty, and resuming (dvclive reads it) stopped with json's `Expecting value: line 1 column 1 (char 0)`, no
    file named, at every re-run; a curve row that is not numbers with a pandas error and its traceback.
    Both are dropped, each named in a warning, and the run resumes; the summary is written again."""
    shutil.copytree(built["checkpoints"], tmp_path / "ckpt")
    shutil.copytree(built["live"], live := tmp_path / "live")
    (live / "metrics.json").write_text("")
    loss = live / "plots" / "metrics" / "train" / "loss.tsv"
    lines = loss.read_text().split("\n")
    lines[3] = "garbage\trow"  # line 4: step 3's
    lines[5] = "5\t"  # how pandas writes a NaN loss back (a diverged step's): kept
    loss.write_text("\n".join(lines))
    tiny_params["cumsum"]["train"]["epochs"] += 1
    with caplog.at_level("WARNING", logger="lib"):
        assert train_into(tmp_path, tiny_params, built)["resumed"]
    assert [m for m in caplog.messages if "dropped" in m] == [
        f"{live / 'metrics.json'}: not a JSON object; dropped (the next validation writes it again)",
        f"{loss}: dropped line 4: not a step and numbers"]
    assert set(json.loads((live / "metrics.json").read_text())) >= {"train", "valid", "step"}
    steps = pd.read_csv(loss, sep="\t")["step"].tolist()
    assert steps == sorted(steps) and 3 not in steps and steps[:4] == [1, 2, 4, 5]


def test_same_params_same_metrics(tmp_path, built):
    """Determinism: a second run of every stage gives the same metrics.json, decoding times aside."""
    from tests.conftest import TINY_PARAMS as params

    cfg = lambda stage: stage_config(params, "cumsum", stage)  # noqa: E731 - a one-line helper, named where it is used
    run_prepare("cumsum", cfg("prepare"), tmp_path / "data")
    run_tokenize("cumsum", cfg("tokenize"), tmp_path / "data", tmp_path / "tok")
    training.run("cumsum", cfg("train"), tmp_path / "data", tmp_path / "tok", tmp_path / "model.pt",
                 tmp_path / "ckpt", tmp_path / "live")
    evaluate_families.run("cumsum", cfg("evaluate"), EvaluatePaths(
        data=tmp_path / "data", tokenizer=tmp_path / "tok", model=tmp_path / "model.pt", metrics=tmp_path /
        "metrics.json", samples=tmp_path / "samples.jsonl", lengths=tmp_path / "by_length.csv"))
    def without_timings(path):
        metrics = json.loads(path.read_text())
        for search in ("greedy",):
            del metrics[search]["seconds"], metrics[search]["sentences_per_s"]
        return metrics

    assert without_timings(tmp_path / "metrics.json") == without_timings(built["metrics"])
    # Byte for byte, so that DVC sees an unchanged output and need not rerun what depends on it.
    assert (tmp_path / "model.pt").read_bytes() == built["model"].read_bytes()
    assert (tmp_path / "tok" / "tokenizer.json").read_bytes() == (built["tokenizer"] / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("change, reason", [
    ("param", "train.model.d_ff changed (32 -> 48)"),
    ("data", "the data, the tokenizer or the code changed"),
])
def test_a_changed_param_or_input_is_named_when_starting_afresh(tmp_path, built, tiny_params, caplog, change, reason):
    """A checkpoint resumes only the run that wrote it: with other params, data, tokens or code (the train
    stage's deps in dvc.yaml), its weights and Adam's moments are no start, and the log says what changed."""
    data = tmp_path / "data"
    shutil.copytree(built["data"], data)
    tiny_params["cumsum"]["train"]["epochs"] = 1
    train_into(tmp_path, tiny_params, built, data)
    if change == "param":
        tiny_params["cumsum"]["train"]["model"]["d_ff"] = 48
    else:  # one training pair fewer
        pd.read_parquet(data / "train.parquet").iloc[1:].to_parquet(data / "train.parquet", index=False)
    with caplog.at_level("INFO", logger="lib"):
        summary = train_into(tmp_path, tiny_params, built, data)
    assert not summary["resumed"] and f"{reason}; starting afresh" in caplog.text


def test_drawn_attention_is_what_the_model_computes(built):
    """The heatmaps' weights: rows sum to 1, nothing above the diagonal, nothing on source padding."""
    tok = tokenizer.load_tokenizers(built["tokenizer"])
    ids = tokenizer.special_ids(tok)
    model, _ = checkpoint.load_model(built["model"])
    pairs = tokenizer.encode_pairs(tok, pd.read_parquet(built["data"] / "test.parquet"))
    lengths = [len(s) for s in pairs.src]
    examples = [lengths.index(min(lengths)), lengths.index(max(lengths))]  # the shorter one is padded
    batch = collate(pairs, examples, ids)
    maps, likeliest = attention_maps.attention_maps(model, batch, ids)
    short = min(lengths)
    for kind, layers in maps.items():
        for w in layers:
            assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-5), kind
    for w in maps["decoder self-attention"]:
        assert torch.all(w.triu(1) == 0)
    for w in maps["cross-attention"] + maps["encoder self-attention"]:
        assert torch.all(w[0, :, :, short:] == 0)  # the padded source positions of the shorter example
    # The same forward as a plain one: asking for the weights changes none of the model's predictions.
    src_mask = padding_mask(batch.src, ids.pad)
    logits = model(batch.src, batch.tgt_in, src_mask, target_mask(batch.tgt_in, ids.pad))
    assert torch.equal(likeliest, logits.argmax(dim=-1))


def test_max_len_below_the_data_fails_before_touching_outputs(tmp_path, built, tiny_params):
    """A bad param on a re-run names the key and leaves the earlier run's checkpoints alone."""
    tiny_params["cumsum"]["train"]["epochs"] = 1
    train_into(tmp_path, tiny_params, built)
    before = (tmp_path / "ckpt" / "last.pt").read_bytes()
    tiny_params["cumsum"]["train"]["model"]["max_len"] = 4
    with pytest.raises(ConfigError, match=r"train\.model\.max_len: 4 is shorter than the longest train sequence"):
        train_into(tmp_path, tiny_params, built)
    assert (tmp_path / "ckpt" / "last.pt").read_bytes() == before


def data_with(tmp_path: Path, built: dict, **splits: pd.DataFrame) -> Path:
    """A copy of ``built``'s data with ``splits`` (name -> frame of src, tgt) in place of its own."""
    data = tmp_path / "data"
    shutil.copytree(built["data"], data)
    for name, frame in splits.items():
        frame.reset_index(drop=True).to_parquet(data / f"{name}.parquet")
    return data


@pytest.mark.parametrize("change, found", [
    (lambda frame: frame.assign(src=frame["src"].where(frame.index != 3, None)), "row 3 (from 0): src is missing"),
    (lambda frame: frame.assign(tgt=range(len(frame))), "row 0 (from 0): tgt is 0 of type int64, not a text"),
    (lambda frame: frame.iloc[:0], "no pairs"),
])
def test_a_split_not_as_prepare_writes_it_is_named_by_row_and_nothing_is_written(tmp_path, built, tiny_params,
                                                                               capsys, change, found):
    """A split edited or made by hand: a missing text, or numbers where the tokenizer takes text, stopped the
    evaluate stage with the tokenizer's TypeError and its traceback (exit 1), an empty split with `max() arg is
    an empty sequence`."""
    data = data_with(tmp_path, built, test=change(pd.read_parquet(built["data"] / "test.parquet")))
    params = tmp_path / "params.yaml"
    outputs = tmp_path / "metrics.json", tmp_path / "samples.jsonl", tmp_path / "by_length.csv"
    params.write_text(yaml.safe_dump(tiny_params))
    argv = ["cumsum", "--params", str(params), "--data", str(data), "--tokenizer", str(built["tokenizer"]),
            "--model", str(built["model"]), "--metrics", str(outputs[0]), "--samples", str(outputs[1]),
            "--lengths", str(outputs[2]), "--generation", str(tmp_path / "generation.json")]
    assert run_stage("evaluate", argv) == 2
    assert last_line(capsys.readouterr().err) == (
        f"evaluate@cumsum: error: {data / 'test.parquet'}: {found}; re-run the prepare stage")
    assert not any(path.exists() for path in outputs)


def test_a_missing_alphabet_is_named_with_the_stage_that_writes_it(tmp_path, built, tiny_params, capsys):
    """cumsum's vocabulary takes every digit and sum from prepare's alphabet.txt: without it, the tokenize
    stage stopped with Python's `[Errno 2] No such file or directory`."""
    data = data_with(tmp_path, built)
    (data / "alphabet.txt").unlink()
    params, tokenizer_dir = tmp_path / "params.yaml", tmp_path / "tok"
    params.write_text(yaml.safe_dump(tiny_params))
    assert run_stage("tokenize", ["cumsum", "--params", str(params), "--data", str(data),
                                  "--out", str(tokenizer_dir)]) == 2
    assert last_line(capsys.readouterr().err) == (
        f"tokenize@cumsum: error: {data / 'alphabet.txt'}: not found (run the prepare stage first)")
    assert not tokenizer_dir.exists()


def test_an_evaluated_split_the_model_cannot_read_is_named_before_training(tmp_path, built, tiny_params):
    """The length study runs to prepare.vocab_length digits, longer than training's: at a max_len that fits
    the training pairs but not those, the evaluate stage failed after training, with the model's own `sequence
    length ... exceeds model.max_len 7`. train.too_long: skip does not help (evaluate may drop no pair)."""
    tiny_params["cumsum"]["train"]["epochs"] = 1
    train_into(tmp_path, tiny_params, built)
    before = (tmp_path / "ckpt" / "last.pt").read_bytes()
    tiny_params["cumsum"]["train"]["model"]["max_len"] = 7  # 5 digits and an eos fit; 8 and an eos do not
    for too_long in ("fail", "skip"):
        tiny_params["cumsum"]["train"]["too_long"] = too_long
        with pytest.raises(ConfigError, match=re.escape(
                "train.model.max_len: 7 is shorter than the longest lengths sequence (9 tokens), which the evaluate "
                "stage decodes and scores; raise it, or lower cumsum.prepare.vocab_length (train.too_long: skip drops "
                "training pairs only)")):
            train_into(tmp_path, tiny_params, built)
    assert (tmp_path / "ckpt" / "last.pt").read_bytes() == before
    # The evaluate stage, run by hand on data with a longer test sentence than its model's max_len (32): named
    # before the losses, nothing written
    long = pd.DataFrame({"src": [" ".join(["1"] * 40)], "tgt": [" ".join(map(str, range(1, 41)))]})
    data = data_with(tmp_path / "other", built, test=pd.concat([pd.read_parquet(built["data"] / "test.parquet"), long]))
    outputs = tmp_path / "metrics.json", tmp_path / "samples.jsonl", tmp_path / "by_length.csv"
    with pytest.raises(ConfigError, match=r"max_len: 32 is shorter than the longest test sequence \(41 tokens\)"):
        evaluate_families.run("cumsum", stage_config(tiny_params, "cumsum", "evaluate"), EvaluatePaths(
            data=data, tokenizer=built["tokenizer"], model=built["model"],
            **dict(zip(("metrics", "samples", "lengths"), outputs))))
    assert not any(path.exists() for path in outputs)


def test_too_long_pairs_are_skipped_with_a_count_when_asked(tmp_path, built, tiny_params, caplog):
    tiny_params["cumsum"]["train"].update(epochs=1, too_long="skip")
    tiny_params["cumsum"]["train"]["model"]["max_len"] = 5  # 5-digit sequences need 6 with eos
    shorten_splits(data := data_with(tmp_path, built), 4)  # the test split and the length study fit whole
    with caplog.at_level("WARNING", logger="lib"):
        train_into(tmp_path, tiny_params, built, data)
    five = (pd.read_parquet(built["data"] / "train.parquet")["src"].str.split().str.len() == 5).sum()
    assert f"train: skipped {five} of 400 pairs longer than train.model.max_len 5" in caplog.text and five > 0
    assert (tmp_path / "model.pt").is_file()


def test_a_budget_below_the_widest_pairs_is_named_with_their_count(tmp_path, built, tiny_params, caplog, monkeypatch):
    """max_tokens below a pair's width is valid (the pair is a batch of one), but a warning names the key before
    the first step; a budget that batches every pair says nothing. Each run stops right after the check: at
    max_tokens 5 every tiny pair is a batch of its own, 400 steps an epoch."""
    class Checked(Exception):
        pass

    def check_then_stop(pairs, max_tokens, check=seq2seq.check_budget):
        check(pairs, max_tokens)
        raise Checked

    monkeypatch.setattr(seq2seq, "check_budget", check_then_stop)
    # n digits to n sums: n + 1 tokens on the target side (bos or eos), over the budget for n = 5, the longest
    wide = (pd.read_parquet(built["data"] / "train.parquet")["src"].str.split().str.len() == 5).sum()
    assert wide > 0
    for max_tokens, warning in ((5, f"train.max_tokens 5: {wide} of 400 train pairs are wider (up to 6 tokens a "
                                    "side), and each of them is a batch of one sentence; raise it to batch them"),
                                (6, "")):
        tiny_params["cumsum"]["train"]["max_tokens"] = max_tokens
        caplog.clear()
        with caplog.at_level("WARNING", logger="lib"), pytest.raises(Checked):
            train_into(tmp_path, tiny_params, built)
        assert warning in caplog.text and ("max_tokens" in caplog.text) == bool(warning)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_activations_stay_in_the_heap():
    """After ``keep_freed_memory`` (training on a CPU calls it) a step's freed blocks are
    reused by the next step instead of being trimmed off and page-faulted back in."""
    lib_device.keep_freed_memory()

    def step():  # four 4 MiB activations alive at once, then all freed
        blocks = [torch.ones(1 << 20) for _ in range(4)]
        return sum(b.sum() for b in blocks)

    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    # glibc's defaults trim the freed 16 MiB every time: ~40,000 faults over these 10 steps.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 5000


def test_auto_precision_is_bf16_only_where_the_hardware_multiplies_bfloat16(tmp_path, caplog):
    cpu = torch.device("cpu")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n")
    assert lib_device.cpu_flags(cpuinfo) >= {"avx2", "avx512_bf16"}
    assert lib_device.cpu_flags(tmp_path / "missing") == set()  # not Linux: no flags, so fp32
    with caplog.at_level("INFO", logger="lib"):
        assert lib_device.resolve_precision("auto", cpu, lib_device.cpu_flags(cpuinfo)) == "bf16"
    assert "train.precision auto: bf16 (cpu has avx512_bf16)" in caplog.text
    assert lib_device.resolve_precision("auto", cpu, {"avx2", "amx_bf16", "amx_tile"}) == "bf16"
    assert lib_device.resolve_precision("auto", cpu, {"avx2", "avx512f", "fma"}) == "fp32"
    assert lib_device.resolve_precision("auto", cpu, set()) == "fp32"
    for given in ("fp32", "bf16"):  # asked for by name: taken as it is
        assert lib_device.resolve_precision(given, cpu, set()) == given
    caplog.clear()
    with caplog.at_level("WARNING", logger="lib"):
        assert lib_device.resolve_precision("bf16", cpu, {"avx2", "fma"}) == "bf16"  # kept, but said to be slow
        assert "bf16 on a CPU without native bfloat16 (no amx_bf16 or avx512_bf16): a step takes about 20x" \
            in caplog.text
        caplog.clear()
        lib_device.resolve_precision("bf16", cpu, {"avx2", "avx512f"})
        assert "a step takes about 1.2x fp32's time here" in caplog.text
        caplog.clear()
        lib_device.resolve_precision("bf16", cpu, {"avx2", "avx512_bf16"})
        lib_device.resolve_precision("bf16", cpu, set())  # flags unknown: nothing to say
    assert caplog.text == ""


def test_the_readmes_python_example_runs(built, capsys):
    """README, "Try a trained model": its Python, on the tiny cumsum model."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'load("models/cumsum")' in code
    exec(compile(code.replace('"models/cumsum"', repr(str(built["model"].parent))), "README.md", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert printed and all(token.isdigit() for token in printed)  # the tiny model's sums, right or not


@pytest.mark.slow  # the command, its own process
def test_the_readmes_generate_command_runs(built):
    """README, "Try a trained model": its `lib.use.generate` line, run as the shell runs it, on the tiny model."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if line.startswith("python -m lib.use.generate"))
    command = line.split("#")[0].replace("python", sys.executable, 1)  # the venv's, as activated
    command += f" --models {built['model'].parent}"
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) >= 1 and all(token.isdigit() for token in done.stdout.split())


def test_the_guides_python_example_runs(built, tmp_path):
    """docs/generate.md, "From Python": its code, on the tiny cumsum model, up to the LM (not trained here)."""
    readme = (ROOT / "docs" / "generate.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    code = code.split('lm = load("models/shakespeare")')[0]  # the part for a translator
    assert 'load("models/cumsum")' in code and '"cross.png"' in code
    code = code.replace('"models/cumsum"', repr(str(built["model"].parent)))
    code = code.replace('"cross.png"', repr(str(tmp_path / "cross.png")))
    exec(compile(code, "docs/generate.md", "exec"), {})
    assert (tmp_path / "cross.png").stat().st_size > 0


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, CUDA])])
def test_a_model_loaded_onto_a_device_translates_and_reads_as_on_the_cpu(built, device):
    """lib.use.inference.load(dir, device): searches, scores and attention run where the model is, and agree
    with the CPU's."""
    from lib.use.inference import load

    here, there = load(built["model"].parent), load(built["model"].parent, device)
    assert next(there.model.parameters()).device.type == device
    sentences = ["3 4 5 6", "1 2", "9 9 9 9 9"]
    assert there.translate(sentences, beam_size=3) == here.translate(sentences, beam_size=3)
    for ours, theirs in zip(there.score(sentences, ["3 7 12 18"] * 3), here.score(sentences, ["3 7 12 18"] * 3)):
        assert ours.log_prob == pytest.approx(theirs.log_prob, abs=1e-3)
    ours, theirs = there.attention("3 4 5 6"), here.attention("3 4 5 6")
    for kind in theirs:
        assert ours[kind].rows == theirs[kind].rows
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(ours[kind].layers, theirs[kind].layers))


def test_apple_silicon_is_taken_when_there_is_one(monkeypatch):
    """device auto: CUDA, else MPS (Apple silicon), else the CPU; mps by name only where it is; precision auto
    keeps fp32 there. The choice alone: no Mac runs these tests."""
    from lib.core.distributed import device_named
    from lib.model.device import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert device_named("auto") == device_named("mps") == torch.device("mps")
    assert resolve_precision("auto", torch.device("mps")) == "fp32"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert device_named("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^train\.device 'mps': no Apple-silicon GPU \(MPS\) is available here"):
        device_named("mps", "train.device")


def test_loading_onto_a_device_that_is_not_here_names_the_device(built):
    """Not torch's deserialisation error, which the checkpoint loader would read as a corrupt file."""
    from lib.use.inference import load

    with pytest.raises(ValueError, match=r"device 'gpu': not a device \(auto, cpu, cuda, cuda:N, mps, ...\)"):
        load(built["model"].parent, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device 'cuda': no CUDA device is available here"):
            load(built["model"].parent, device="cuda")
    assert next(load(built["model"].parent, device="auto").model.parameters()).device.type == (
        "cuda" if torch.cuda.is_available() else "cpu")
    for device, message in [(None, r"device None: not a device \(auto, cpu"),
                            *([("mps", r"device 'mps': no Apple-silicon GPU \(MPS\) is available here")]
                              if not torch.backends.mps.is_available() else []),
                            ("meta", "device 'meta': not a device this toolkit runs on")]:
        with pytest.raises(ValueError, match=message):  # not "model.pt: not a readable checkpoint (corrupt ...)"
            load(built["model"].parent, device=device)
    here = load(built["model"].parent, device="cpu:0")  # torch.load cannot map onto cpu:0; the CPU is one
    assert next(here.model.parameters()).device == torch.device("cpu")
    assert here.translate("3 4 5 6") == load(built["model"].parent).translate("3 4 5 6")


def test_a_gpu_index_this_machine_lacks_is_named(monkeypatch):
    """cuda:3 on a machine of two GPUs: the index is named with the ones there are, before anything loads."""
    from lib.core.distributed import device_named

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_named("cuda:1") == torch.device("cuda", 1) and device_named("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=re.escape("--device 'cuda:3': this machine has 2 CUDA device(s), cuda:0 to "
                                                   "cuda:1")):
        device_named("cuda:3", "--device")


def test_loading_a_models_directory_that_is_not_one_names_it(built, tmp_path):
    """A task never built, or the model file given for its directory: named as such, not as a tokenizer.json
    missing inside it."""
    from lib.use.inference import load

    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'shakespeare'}: not found (run the train "
                                                          "stage first)")):
        load(tmp_path / "shakespeare")
    with pytest.raises(ValueError, match=re.escape(f"{built['model']}: a file is there, where a directory is read")):
        load(built["model"])


def test_a_translator_names_an_argument_of_the_wrong_type_before_any_work(built, monkeypatch):
    """lib.use.inference from Python: 2.0 for beam_size, "0.6" for alpha, bytes or a number for a text are a
    TypeError naming the argument (not torch's, from deep in a search), raised before a sentence is read; numpy's
    numbers and a pandas Series are taken as Python's own."""
    from lib.use import inference
    from lib.use import translator as translator_module

    translator = inference.load(built["model"].parent)
    assert translator.translate(pd.Series(["1 2", "3"]), beam_size=pd.Series([2]).iloc[0],  # a numpy int64
                                alpha=pd.Series([0.6]).iloc[0]) == translator.translate(["1 2", "3"], beam_size=2)
    for name in ("translate_lines", "score_lines"):
        monkeypatch.setattr(translator_module, name, lambda *args, **kwargs: pytest.fail("work began"))
    for call, message in [
            (lambda: translator.translate("1 2", beam_size=2.0), "beam_size 2.0: must be an integer"),
            (lambda: translator.translate("1 2", beam_size=True), "beam_size True: must be an integer"),
            (lambda: translator.translate("1 2", alpha="0.6", max_extra_tokens=2.5),  # None: the model's default
             "alpha '0.6': must be a number; max_extra_tokens 2.5: must be an integer"),
            (lambda: translator.n_best("1 2", k="2"), "k '2': must be an integer$"),
            (lambda: translator.translate(b"1 2"), "sentences: a str or a list of str, not bytes"),
            (lambda: translator.translate(None), "sentences: a str or a list of str, not NoneType"),
            (lambda: translator.n_best(["1 2", 3, None], k=1), r"sentences\[1\]: a str, not int \(2 such in all\)"),
            (lambda: translator.score("1 2", 3), "outputs: a str or a list of str, not int"),
            (lambda: translator.score(["1 2", "3"], pd.read_csv(io.StringIO("tgt\n1 3\n\n"),
                                                                  skip_blank_lines=False)["tgt"]),
             r"outputs\[1\]: a str, not float: NaN, an empty cell as pandas reads it \(read_csv\(\.\.\., "
             r"keep_default_na=False\) keeps it ''\)"),
            (lambda: translator.attention(b"1 2"), "sentence: a str, not bytes"),
            (lambda: translator.attention("1 2", ["1 3"]), "output: a str, not list"),
            (lambda: inference.Translator(translator.model, translator.tokenizers, max_tokens=1e4),
             "max_tokens 10000.0: must be an integer")]:
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(ValueError, match=r"k 0: must be in \[1, 1000\]$"):  # the range, once the type is right
        translator.n_best("1 2", k=0)


@pytest.mark.slow  # generate at a terminal
@pytest.mark.parametrize("options", [[], ["--beam-size", "2", "--n-best", "2"]])
def test_generate_translates_each_line_typed_at_a_terminal_as_it_is_entered(built, tmp_path, capsys, monkeypatch,
                                                                            options):
    """--input - at a terminal: each line's output (its n-best rows) is shown before the next line is read,
    and all of it is what the same lines in a file give; an --output file and --attention are written at
    the end of input, as for a file."""
    from lib.use import generate

    typed = ["3 4 5", "", "1 x 2", "9 9"]
    (tmp_path / "in.txt").write_text("\n".join(typed) + "\n", encoding="utf-8")
    run = ["--task", "cumsum", "--models", str(built["model"].parent)] + options
    generate.main(run + ["--input", str(tmp_path / "in.txt")])
    expected = capsys.readouterr().out
    rows = expected.splitlines()[1:] if options else expected.splitlines()

    shown = []  # stdout before each line is read
    monkeypatch.setattr(sys, "stdin", Terminal([line.encode() + b"\n" for line in typed],
                                               lambda: shown.append(capsys.readouterr().out)))
    generate.main(run + ["--input", "-", "--attention", str(tmp_path / "att")])
    assert "".join(shown) + capsys.readouterr().out == expected
    if options:  # the header at once, then each translated line's two rows (none for the empty line)
        pairs = ["".join(row + "\n" for row in rows[i:i + 2]) for i in (0, 2, 4)]
        assert shown == ["line\trank\tscore\tlog_prob\ttokens\teos\ttranslation\n", pairs[0], "", pairs[1],
                         pairs[2]]
    else:
        assert shown == [""] + [row + "\n" for row in rows]  # line k's output, before line k + 1 is read
    assert "## Line 4" in (tmp_path / "att" / "attention.md").read_text()

    monkeypatch.setattr(sys, "stdin", Terminal([line.encode() + b"\n" for line in typed], lambda: None))
    generate.main(run + ["--input", "-", "--output", str(tmp_path / "out.txt")])
    out, err = capsys.readouterr()
    assert out == "" and (tmp_path / "out.txt").read_text(encoding="utf-8") == expected
    assert "translating each line as you enter it; Ctrl-D to end" in err
    assert "generate: line 3: not in the model's vocabulary, read as <unk>: 'x'" in err


def test_a_file_has_a_line_for_each_newline(built, tmp_path, capsys, monkeypatch):
    """An --input file's lines end at "\\n" or "\\r\\n", as the prepare stage and a terminal read them: a form
    feed, U+2028 or U+0085 within a line (where str.splitlines breaks too) stays in it, and each line has
    one output line, the one the same line typed at a terminal gets. A byte-order mark starting the file
    (Notepad's "UTF-8 with BOM") is not read as part of the first number."""
    from lib.use import generate

    typed = ["3 4\x0c5", "1 2\u20282", "6\x857", "9 9"]
    (tmp_path / "in.txt").write_bytes("\ufeff".encode() + "\r\n".join(typed).encode() + b"\r\n")
    run = ["--task", "cumsum", "--models", str(built["model"].parent), "--input"]
    generate.main(run + [str(tmp_path / "in.txt"), "--output", str(tmp_path / "file.txt")])
    read_from_file = capsys.readouterr().err.splitlines()
    monkeypatch.setattr(sys, "stdin", Terminal([line.encode() + b"\n" for line in typed], lambda: None))
    generate.main(run + ["-", "--output", str(tmp_path / "typed.txt")])
    outputs = (tmp_path / "file.txt").read_text(encoding="utf-8")
    assert len(outputs.split("\n")) == len(typed) + 1 and outputs.endswith("\n")
    assert outputs == (tmp_path / "typed.txt").read_text(encoding="utf-8")
    assert read_from_file == capsys.readouterr().err.splitlines()[1:]  # the same <unk>s named, none for the mark


def test_an_output_that_is_a_device_a_pipe_or_a_symlink_stays_one(built, tmp_path, capsys):
    """--output a device (/dev/null), a named pipe or a symlink is written as the shell's ``>`` writes it:
    the pipe gets the lines, the link's file is replaced and the link stays. Replacing such a path with a
    file, as a plain file is replaced, put a file where a root user's /dev/null was; a full device is one
    line naming the --output given, and exit status 2."""
    import threading

    from lib.use import generate

    (tmp_path / "in.txt").write_text("3 4 5\n9 9\n", encoding="utf-8")
    run = ["--task", "cumsum", "--models", str(built["model"].parent), "--input", str(tmp_path / "in.txt"), "--output"]
    generate.main(run + [str(tmp_path / "plain.txt")])
    expected = (tmp_path / "plain.txt").read_text(encoding="utf-8")
    assert expected.count("\n") == 2

    (tmp_path / "file.txt").write_text("earlier\n")
    for name, target in (("link.txt", "file.txt"), ("null", "/dev/null"), ("full", "/dev/full")):
        (tmp_path / name).symlink_to(target)
    generate.main(run + [str(tmp_path / "link.txt")])
    generate.main(run + [str(tmp_path / "null")])
    assert (tmp_path / "file.txt").read_text(encoding="utf-8") == expected
    with pytest.raises(SystemExit) as exit_info:
        generate.main(run + [str(tmp_path / "full")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"generate: error: [Errno 28] No space left on device: '{tmp_path / 'full'}'\n"
    assert all((tmp_path / name).is_symlink() for name in ("link.txt", "null", "full"))

    os.mkfifo(tmp_path / "pipe")
    read = []
    reader = threading.Thread(target=lambda: read.append((tmp_path / "pipe").read_text(encoding="utf-8")),
                              daemon=True)  # left blocked, not waited for, if nothing opens the pipe to write
    reader.start()
    generate.main(run + [str(tmp_path / "pipe")])
    reader.join(timeout=30)
    assert read == [expected] and (tmp_path / "pipe").is_fifo()


def test_ctrl_c_at_the_terminal_keeps_what_was_shown(built, capsys, monkeypatch):
    """Ctrl-C while lines are typed: exit 130 and one line; the outputs shown so far stay, so the message
    does not claim that --output was not written."""
    from lib.use import generate

    reads = []

    def ctrl_c_at_the_second_line():
        reads.append(len(reads) + 1)
        if reads[-1] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(sys, "stdin", Terminal([b"3 4\n", b"5 6\n"], ctrl_c_at_the_second_line))
    with pytest.raises(SystemExit) as exit_info:
        generate.main(["--task", "cumsum", "--models", str(built["model"].parent), "--input", "-"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 130 and len(out.splitlines()) == 1
    assert err.splitlines()[-1] == "generate: interrupted"


def test_the_tour_runs_as_written():
    """docs/tour.md: every example at the Python prompt gives the output printed under it."""
    import doctest

    result = doctest.testfile(str(ROOT / "docs" / "tour.md"), module_relative=False, report=True)
    assert result.attempted > 60 and result.failed == 0


@pytest.mark.slow  # a stage at a terminal, its own process
def test_progress_bars_at_a_terminal_plain_epoch_lines_in_a_log(tmp_path, built, tiny_params):
    """tqdm drew carriage-return frames into `dvc repro > log` too: a fresh clone's log held 348 kB of them."""
    import fcntl
    import pty
    import termios

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    argv = [sys.executable, "-m", "stages.train", "cumsum", "--params", str(params), "--data", str(built["data"]),
            "--tokenizer", str(built["tokenizer"])]
    logged = subprocess.run(argv + ["--model", str(tmp_path / "a.pt"), "--checkpoints", str(tmp_path / "a"),
                                    "--live", str(tmp_path / "a_live")], cwd=ROOT, capture_output=True, text=True)
    assert logged.returncode == 0 and "\r" not in logged.stderr
    assert "epoch 1: valid loss" in logged.stderr and "epoch 2: valid loss" in logged.stderr
    main, terminal = pty.openpty()  # stderr at a terminal, 100 columns wide: the bars are drawn
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    shown = subprocess.Popen(argv + ["--model", str(tmp_path / "b.pt"), "--checkpoints", str(tmp_path / "b"),
                                     "--live", str(tmp_path / "b_live")], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=terminal)
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end closed: the process is done
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert shown.wait(timeout=60) == 0
    assert b"\repoch 1/2:" in seen and b"it/s" in seen


def test_every_metric_a_task_declares_is_one_evaluate_writes(built):
    """Task.metric_names(), which the headline patterns are checked against, is what the evaluate stage writes:
    cumsum's, with its length study (the LM's in tests/test_lm.py)."""
    from fnmatch import fnmatchcase

    from lib.core.config import flatten

    written = flatten(json.loads(built["metrics"].read_text()))
    unwritten = [name for name in cumsum.Cumsum.metric_names() if not any(fnmatchcase(key, name) for key in written)]
    assert unwritten == ["beam*.exact_match", "beam*.token_accuracy"]  # the tiny params decode greedily only
