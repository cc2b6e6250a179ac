"""The decoder-only LM task: split, blocks, weight decay groups, sampling, and its stages."""

import fnmatch
import json
import math
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from lib.model import device
from lib.evaluate import evaluation
from lib.evaluate import families as evaluate_families
from lib.evaluate.evaluation import EvaluatePaths
from lib.report.reporting import ReportPaths
from lib.report import reporting
from lib.train import run
from lib.data import tokenizer
from lib.tasks.writing import run_tokenize
from lib.train import lm as lm_loop, training
from lib.core.config import ConfigError, from_dict
from lib.core.sections import LMEvaluateConfig, LMReportConfig, LMTrainConfig, TokenizeConfig
from lib.core.text import load_params
from transformer.sampling import sample, top_k_filter
from transformer.model import TransformerLM
from lib.train.lm import weight_decay_groups
from transformer.schedules import cosine_lr
from lib.data.sources import sha256
from lib.tasks import shakespeare
from lib.tasks.writing import run_fetch
from tests.conftest import ROOT, Terminal, check_rerunnable, fetch_and_prepare, model_config, serving

SHARED_TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
PLAY = "".join(
    f"{name}:\nWhat say you, {other}, to this {thing}?\nI say the {thing} is fair.\n\n"
    for name, other, thing in [("ROMEO", "friar", "night"), ("JULIET", "nurse", "day"), ("FRIAR", "boy", "rose")] * 12
)


def prepare_text(source, out: Path, sha256: str = "") -> Path:
    """The fetch stage on ``source`` (a path or URL), then prepare, as `dvc repro` runs them."""
    return fetch_and_prepare("shakespeare", shakespeare.FetchConfig(source=str(source), sha256=sha256),
                             shakespeare.PrepareConfig(train_fraction=0.9), out)


@pytest.fixture(scope="module")
def lm_built(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    source = root / "play.txt"
    source.write_text(PLAY)
    p = {"data": root / "data", "tok": root / "tok", "model": root / "model.pt", "ckpt": root / "ckpt",
         "live": root / "live", "metrics": root / "metrics.json", "samples": root / "samples.jsonl",
         "report": root / "report.md", "figures": root / "figures", "source": source,
         "lengths": root / "by_length.csv", "losses": root / "losses.csv"}
    prepare_text(source, p["data"])
    run_tokenize("shakespeare", TokenizeConfig(kind="char", min_frequency=1), p["data"], p["tok"])
    cfg = LMTrainConfig(seed=0, device="cpu", max_iters=60, batch_size=8, block_size=16, schedule="cosine", lr=3e-3,
                        min_lr=3e-4, warmup=10, weight_decay=0.1, beta2=0.99, clip_norm=1.0, eval_every=20,
                        eval_batches=2, checkpoint_every=20,
                        model=model_config(encoder_layers=0, decoder_layers=2, norm_first=True, tie_embeddings=True,
                                           max_len=16, bias=False))
    p["summary"] = training.run("shakespeare", cfg, p["data"], p["tok"], p["model"], p["ckpt"], p["live"])
    eval_cfg = LMEvaluateConfig(prompts=("ROMEO:\n", "JU"), max_new_tokens=30, temperature=0.8, top_k=5, seed=0)
    p["metrics_dict"] = evaluate_families.run("shakespeare", eval_cfg, EvaluatePaths(
        data=p["data"], tokenizer=p["tok"], model=p["model"], metrics=p["metrics"], samples=p["samples"],
        lengths=p["lengths"]))
    reporting.run("shakespeare", LMReportConfig(passage_tokens=12), ReportPaths(
                      data=p["data"], tokenizer=p["tok"], model=p["model"], metrics=p["metrics"],
                      samples=p["samples"], lengths=p["lengths"], live=p["live"],
                      out=p["report"], figures=p["figures"], losses=p["losses"]))
    return p


def models_dir(lm_built, tmp_path) -> Path:
    """The trained LM laid out as `dvc repro` leaves it (model.pt and tokenizer/), for lib.use.generate --models."""
    models = tmp_path / "models"
    shutil.copytree(lm_built["tok"], models / "tokenizer")
    shutil.copyfile(lm_built["model"], models / "model.pt")
    return models


def test_every_directory_the_lms_stages_wrote_is_one_they_may_write_again(lm_built):
    """The LM's data is text (train.txt, valid.txt), not parquet: what the task declares prepare writes."""
    check_rerunnable({("prepare", "out"): lm_built["data"], ("tokenize", "out"): lm_built["tok"],
                      ("train", "checkpoints"): lm_built["ckpt"], ("train", "live"): lm_built["live"],
                      ("report", "figures"): lm_built["figures"]}, "shakespeare")


def test_divergence_names_the_lms_learning_rate_param(lm_built, tmp_path):
    """The LM's rate is train.lr (the encoder-decoder's, train.lr_factor: tests/test_stages.py)."""
    cfg = LMTrainConfig(seed=0, device="cpu", max_iters=10, batch_size=4, block_size=8, schedule="noam", lr=1e30,
                        min_lr=0.0, warmup=1, weight_decay=0.0, beta2=0.99, clip_norm=1.0, eval_every=10,
                        eval_batches=1, checkpoint_every=10,
                        model=model_config(d_model=16, n_heads=2, encoder_layers=0, decoder_layers=1, d_ff=32,
                                           max_len=8))
    diverged = r"training diverged at step \d+: .*\(train\.lr, train\.warmup\)"
    with pytest.raises(run.DivergedError, match=diverged):
        training.run("shakespeare", cfg, lm_built["data"], lm_built["tok"], tmp_path / "model.pt", tmp_path / "ckpt",
                     tmp_path / "live")


def test_a_gpu_out_of_memory_names_the_lms_batch_params(lm_built, tmp_path, monkeypatch):
    """The LM's batch is batch_size blocks of block_size (the encoder-decoder's: tests/test_stages.py)."""
    from tests.test_stages import OUT_OF_MEMORY

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError(OUT_OF_MEMORY)

    monkeypatch.setattr(lm_loop, "lm_loss", out_of_memory)
    cfg = LMTrainConfig(seed=0, device="cpu", max_iters=10, batch_size=4, block_size=8, schedule="noam", lr=1e-3,
                        min_lr=0.0, warmup=1, weight_decay=0.0, beta2=0.99, clip_norm=1.0, eval_every=10,
                        eval_batches=1, checkpoint_every=10, accumulate=2,
                        model=model_config(d_model=16, n_heads=2, encoder_layers=0, decoder_layers=1, d_ff=32,
                                           max_len=8))
    with pytest.raises(device.OutOfMemory, match=r"^CUDA out of memory. Tried to allocate 2.00 GiB: a batch is "
                       r"train.batch_size 4 blocks of train.block_size 8 tokens; halve batch_size and double "
                       r"train.accumulate \(now 2\): an update sees as many tokens, in half the memory; or make "
                       r"train.model smaller$"):
        training.run("shakespeare", cfg, lm_built["data"], lm_built["tok"], tmp_path / "model.pt", tmp_path / "ckpt",
                     tmp_path / "live")


@pytest.mark.slow  # a stage as its own process
def test_the_cpu_running_out_of_memory_names_the_lms_batch_params(lm_built, tmp_path):
    """A real allocation the machine refuses: train.batch_size 10^10 (a typo's size) asks for 75 GiB of block
    indices at once. It was torch's `RuntimeError: [enforce fail at alloc_cpu.cpp:127] ... DefaultCPUAllocator:
    can't allocate memory` traceback. The stage runs with its address space capped at 8 GiB, so that no
    machine's memory or overcommit setting lets the allocation through."""
    import resource
    import subprocess

    import yaml

    params = load_params(ROOT / "params.yaml")
    params["tasks"] = ["shakespeare"]
    params["shakespeare"]["train"].update(device="cpu", batch_size=10 ** 10, block_size=16)
    params["shakespeare"]["report"].update(passage_tokens=16)  # a passage within the blocks
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (8 * 2 ** 30, 8 * 2 ** 30))

    result = subprocess.run(
        [sys.executable, "-m", "stages.train", "shakespeare", "--data", str(lm_built["data"]), "--tokenizer",
         str(lm_built["tok"]), "--model", str(tmp_path / "model.pt"), "--checkpoints", str(tmp_path / "ckpt"),
         "--live", str(tmp_path / "live"), "--params", str(tmp_path / "params.yaml")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=cap_memory)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "train@shakespeare: error: CPU out of memory. Tried to allocate 74.51 GiB: a batch is train.batch_size "
        "10000000000 blocks of train.block_size 16 tokens; halve batch_size and double train.accumulate (now 1): "
        "an update sees as many tokens, in half the memory; or make train.model smaller"), result.stderr
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize("schedule, resumes", [("noam", True), ("cosine", False)])
def test_raising_max_iters_continues_only_where_the_schedule_does_not_depend_on_it(lm_built, tmp_path, schedule,
                                                                                  resumes, caplog):
    """Noam's rate at a step is the same whatever max_iters is, so 20 + 20 more steps are a straight 40.
    Cosine decays to min_lr at max_iters: continuing would climb back up the new curve from step 20 (the
    shakespeare defaults' validation loss rose from 1.551 to 1.624 doing it), so it starts afresh."""
    def train(max_iters: int, name: str) -> dict:
        cfg = LMTrainConfig(seed=0, device="cpu", max_iters=max_iters, batch_size=4, block_size=8, schedule=schedule,
                            lr=3e-3, min_lr=3e-4, warmup=5, weight_decay=0.1, beta2=0.99, clip_norm=1.0,
                            eval_every=10, eval_batches=1, checkpoint_every=10,
                            model=model_config(d_model=16, n_heads=2, encoder_layers=0, decoder_layers=1, d_ff=32,
                                               max_len=8))
        return training.run("shakespeare", cfg, lm_built["data"], lm_built["tok"], tmp_path / name / "model.pt",
                            tmp_path / name / "ckpt", tmp_path / name / "live")

    train(20, "raised")
    with caplog.at_level("INFO", logger="lib"):
        raised = train(40, "raised")
    assert raised["resumed"] == resumes
    assert resumes or "train.max_iters changed (20 -> 40); starting afresh" in caplog.text
    train(40, "straight")
    weights = [torch.load(tmp_path / name / "model.pt", weights_only=True)["model"] for name in ("raised", "straight")]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[1])  # either way: a straight 40


def test_accumulating_two_batches_is_one_step_on_both(lm_built, tmp_path):
    """train.accumulate: 2 batches of 4 blocks a step gives the steps of 8 blocks at once: the sampler draws
    the same blocks either way (4 then 4, or 8), so the weights and the logged losses agree."""
    def train(batch_size: int, accumulate: int, name: str):
        cfg = LMTrainConfig(seed=0, device="cpu", max_iters=20, batch_size=batch_size, block_size=8,
                            schedule="cosine", lr=3e-3, min_lr=3e-4, warmup=5, weight_decay=0.1, beta2=0.99,
                            clip_norm=1.0, eval_every=10, eval_batches=1, checkpoint_every=10, accumulate=accumulate,
                            model=model_config(d_model=16, n_heads=2, encoder_layers=0, decoder_layers=1, d_ff=32,
                                               max_len=8, bias=False))  # no key bias: its zero gradient's rounding
        training.run("shakespeare", cfg, lm_built["data"], lm_built["tok"], tmp_path / name / "model.pt",
                     tmp_path / name / "ckpt", tmp_path / name / "live")
        curves = tmp_path / name / "live" / "plots" / "metrics" / "train"
        return (torch.load(tmp_path / name / "ckpt" / "last.pt", weights_only=True)["model"],
                {c: pd.read_csv(curves / f"{c}.tsv", sep="\t")[c].values
                 for c in ("loss", "grad_norm", "tokens_per_s")})

    (accumulated, curves), (whole, whole_curves) = train(4, 2, "accumulated"), train(8, 1, "whole")
    for name, weight in whole.items():
        torch.testing.assert_close(accumulated[name], weight, rtol=1e-5, atol=1e-6, msg=name)
    for curve in ("loss", "grad_norm"):
        torch.testing.assert_close(torch.tensor(curves[curve]), torch.tensor(whole_curves[curve]), rtol=1e-5, atol=1e-6)
    assert len(curves["tokens_per_s"]) == 20


def test_split_is_90_10_by_characters(lm_built):
    train = (lm_built["data"] / "train.txt").read_text()
    valid = (lm_built["data"] / "valid.txt").read_text()
    assert train + valid == PLAY
    assert len(train) == int(len(PLAY) * 0.9)


def test_missing_source_is_named():
    with pytest.raises(ConfigError, match=r"^shakespeare\.fetch\.source: nowhere/input.txt: no such file \(give the "
                                          r"text's URL, as params.yaml does, or a local copy\)$"):
        from_dict(shakespeare.FetchConfig, {"source": "nowhere/input.txt"}, "shakespeare.fetch")


def test_char_tokenizer_round_trips_spaces_and_newlines(lm_built):
    tok = tokenizer.load_tokenizers(lm_built["tok"]).target
    text = "ROMEO:\nWhat say  you?\n\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tokenizer.special_ids(tok).pad is not None


def test_blocks_are_contiguous_and_targets_shift_by_one():
    ids = torch.arange(100)
    x, y = lm_loop.random_blocks(ids, 6, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (6, 10)
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(6, 9, dtype=torch.long))
    assert torch.equal(y, x + 1)
    assert int(y.max()) <= 99


def test_weight_decay_only_on_linear_weights():
    model = TransformerLM(model_config(tie_embeddings=True), 30)
    decay, keep = weight_decay_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    assert decayed and all(n.endswith("weight") and ("proj" in n or "linear" in n) for n in decayed)
    kept = {names[id(p)] for p in keep["params"]}
    assert "embed.tokens.weight" in kept  # tied with the generator: not decayed
    assert all(n in kept for n in names.values() if n.endswith("bias") or "norm" in n)
    assert len(decayed) + len(kept) == len(list(model.parameters()))


def test_cosine_schedule():
    assert cosine_lr(0, 1.0, 0.1, 10, 110) == 0.0
    assert cosine_lr(10, 1.0, 0.1, 10, 110) == pytest.approx(1.0)
    assert cosine_lr(60, 1.0, 0.1, 10, 110) == pytest.approx(0.55)
    assert cosine_lr(110, 1.0, 0.1, 10, 110) == pytest.approx(0.1)


def test_top_k_filter_keeps_the_k_largest():
    logits = torch.tensor([0.1, 2.0, -1.0, 3.0, 0.5])
    kept = torch.isfinite(top_k_filter(logits, 2))
    assert kept.tolist() == [False, True, False, True, False]
    assert torch.equal(top_k_filter(logits, 0), logits)


def test_sampling_is_seeded_and_stays_in_the_top_k():
    model = TransformerLM(model_config(max_len=32), 20).eval()
    draw = lambda seed, k: sample(model, [1, 2, 3], 12, 1.5, k, torch.Generator().manual_seed(seed), 32)  # noqa: E731 - a one-line helper, named where it is used
    assert draw(7, 4) == draw(7, 4)
    assert draw(7, 0) != draw(8, 0)
    out = draw(3, 4)
    for t in range(3, len(out)):
        logits = model(torch.tensor([out[:t]]))[0, -1]
        assert out[t] in torch.topk(logits, 4).indices.tolist()
    greedy = draw(0, 1)
    for t in range(3, len(greedy)):
        assert greedy[t] == int(model(torch.tensor([greedy[:t]]))[0, -1].argmax())


def test_lm_stages_write_metrics_samples_and_report(lm_built):
    metrics = json.loads(lm_built["metrics"].read_text())
    assert set(metrics) == {"n_valid_tokens", "loss", "perplexity", "bits_per_char", "parameters"}
    assert metrics["bits_per_char"] == pytest.approx(metrics["loss"] / 0.6931471805599453)  # chars = tokens
    assert metrics["loss"] < 3.0  # far below uniform over the alphabet (ln 30 = 3.4)
    samples = pd.read_json(lm_built["samples"], lines=True)
    assert samples["prompt"].tolist() == ["ROMEO:\n", "JU"] and all(len(s) == 30 for s in samples["sample"])
    curve = pd.read_csv(lm_built["live"] / "plots" / "metrics" / "valid" / "loss.tsv", sep="\t")
    assert curve["step"].tolist() == [20, 40, 60]
    text = lm_built["report"].read_text()
    for link in [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]:
        assert Path(lm_built["report"].parent / link).read_bytes()[:4] == b"\x89PNG"
    assert "self_attention.png" in text and "```" in text
    assert "label-smoothed" not in text  # the LM trains on plain cross-entropy: no floor to explain
    assert "A decoder-only language model of " in text and " tokens a second." in text
    assert "source and target" not in text


class Uniform(torch.nn.Module):
    """A language model that gives each of its V tokens the same probability: ln V nats a token."""

    def __init__(self, V: int):
        super().__init__()
        self.V, self.anchor = V, torch.nn.Parameter(torch.zeros(()))  # a parameter: the device to read on

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.anchor.expand(*ids.shape, self.V)  # (B, T, V)


def test_bits_per_character_spreads_each_tokens_bits_over_its_characters():
    """With BPE (tokenize.kind: bpe) a token holds several characters: 8 equally likely tokens are 3 bits a
    token, and at 4 characters a token, 0.75 bits a character."""
    ids = torch.randint(8, (50,), generator=torch.Generator().manual_seed(0))
    scores = evaluation.text_metrics(Uniform(8), ids, n_chars=200, block_size=16)
    assert scores["loss"] == pytest.approx(math.log(8)) and scores["perplexity"] == pytest.approx(8.0)
    assert scores["bits_per_char"] == pytest.approx(0.75) and scores["tokens"] == 50


def test_prompts_and_passage_that_the_model_cannot_take_are_named(lm_built, tmp_path):
    """An empty prompt, a heatmap passage longer than the training blocks, or an <eos> for sources an LM does
    not have: named before anything is written."""
    with pytest.raises(ConfigError, match=r"shakespeare\.evaluate\.prompts: an empty prompt"):
        from_dict(LMEvaluateConfig, {"prompts": ["ROMEO:", ""], "max_new_tokens": 5, "temperature": 1.0,
                                     "top_k": 0, "seed": 0}, "shakespeare.evaluate")
    report, figures = tmp_path / "report.md", tmp_path / "figures"
    with pytest.raises(ConfigError, match=r"report\.passage_tokens: 17 is longer than .* \(train\.block_size 16\)"):
        reporting.run("shakespeare", LMReportConfig(passage_tokens=17), ReportPaths(
                          data=lm_built["data"], tokenizer=lm_built["tok"], model=lm_built["model"],
                          metrics=lm_built["metrics"], samples=lm_built["samples"],
                          lengths=lm_built["lengths"], live=lm_built["live"], out=report,
                          figures=figures, losses=tmp_path / "losses.csv"))
    assert not report.exists() and not figures.exists() and not list(tmp_path.glob(".figures*"))
    out = tmp_path / "tok"
    with pytest.raises(ConfigError, match=r"shakespeare\.tokenize\.source_eos: applies to translation tasks"):
        run_tokenize("shakespeare", TokenizeConfig(kind="char", min_frequency=1, source_eos=True),
                      lm_built["data"], out)
    assert not out.exists()


def test_an_evaluate_prompt_the_model_cannot_read_is_named_in_the_log(lm_built, tmp_path, caplog):
    """A character the training text lacks, in an evaluate prompt (a curly quote typed into params.yaml), was
    read as <unk> without a word: the sample was drawn from a prompt the model could not see."""
    cfg = LMEvaluateConfig(prompts=("JU", "RO\u2019\u2603ME"), max_new_tokens=5, temperature=0.8, top_k=5, seed=0)
    metrics, samples = tmp_path / "metrics.json", tmp_path / "samples.jsonl"
    with caplog.at_level("WARNING", logger="lib.evaluate.evaluation"):
        evaluate_families.run("shakespeare", cfg, EvaluatePaths(
            data=lm_built["data"], tokenizer=lm_built["tok"], model=lm_built["model"], metrics=metrics,
            samples=samples, lengths=tmp_path / "by_length.csv"))
    assert [r.getMessage() for r in caplog.records] == [
        "shakespeare.evaluate.prompts[1]: not in the model's vocabulary, read as <unk>: '\u2019\u2603'"]
    rows = pd.read_json(samples, lines=True, dtype=False)
    assert rows["prompt"].tolist() == list(cfg.prompts) and rows["sample"].str.len().tolist() == [5, 5]


@pytest.mark.parametrize("content, message", [
    (b"", r"input.txt is empty"),
    (b"ROMEO:\nO \xff\xfe night\n", r"shakespeare\.fetch\.source: .*input.txt: line 2: not UTF-8 \(byte 2\)"),
])
def test_bad_source_is_named_and_nothing_is_written(tmp_path, content, message):
    source = tmp_path / "play.txt"
    source.write_bytes(content)
    out = tmp_path / "data"
    out.mkdir()
    (out / "train.txt").write_text("an earlier, good split")
    with pytest.raises(ConfigError, match=message):
        prepare_text(source, out)
    assert (out / "train.txt").read_text() == "an earlier, good split"  # the earlier output is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "data_sources", "play.txt"]  # no temporary left


def test_source_url_is_downloaded_checked_and_an_unreachable_one_is_named(tmp_path):
    """shakespeare.fetch.source as an http URL, served here by a local server: the same splits as the
    local file (the byte-order mark some editors start a file with is not text), its sha256 checked; a
    missing page, a closed port or another sum is one error naming the param, and nothing is written."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "play.txt").write_bytes("\ufeff".encode() + PLAY.encode())
    with serving(served) as url:
        prepare_text(f"{url}/play.txt", tmp_path / "data", sha256(served / "play.txt"))
        assert (tmp_path / "data" / "train.txt").read_text() + (tmp_path / "data" / "valid.txt").read_text() == PLAY
        for source, reason in [(f"{url}/missing.txt", "HTTP Error 404"), ("http://127.0.0.1:9/play.txt", "refused")]:
            with pytest.raises(ConfigError, match=rf"^shakespeare\.fetch\.source: could not download {source} "
                                                  rf"\(.*{reason}.*\); without internet, point shakespeare\.fetch"
                                                  rf"\.source at a local copy of the text: dvc exp run -S "):
                run_fetch("shakespeare", shakespeare.FetchConfig(source=source), tmp_path / "other")
            assert not (tmp_path / "other").exists()
        with pytest.raises(ConfigError, match=rf"^shakespeare\.fetch\.source: {url}/play\.txt: its sha256 is "
                                              rf"{sha256(served / 'play.txt')}, not the published 1{{64}} "):
            run_fetch("shakespeare", shakespeare.FetchConfig(source=f"{url}/play.txt", sha256="1" * 64),
                      tmp_path / "other")
    with pytest.raises(ConfigError, match=r"^shakespeare\.fetch\.source: .*play\.txt: its sha256 is [0-9a-f]{64}, "
                                          r"not shakespeare\.fetch\.sha256 1{64} \(another text"):
        run_fetch("shakespeare", shakespeare.FetchConfig(source=str(served / "play.txt"), sha256="1" * 64),
                  tmp_path / "other")
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob(".other*"))


@pytest.mark.skipif(not SHARED_TEXT.is_file(), reason="no ../shared/data/tinyshakespeare on this machine")
def test_the_pinned_sum_is_that_of_the_text_nanogpt_reads():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert params["shakespeare"]["fetch"]["sha256"] == sha256(SHARED_TEXT)


def test_generate_continues_a_prompt(tmp_path, lm_built, capsys):
    from lib.use import attention_figures, command, generate

    models = models_dir(lm_built, tmp_path)
    run = ["--task", "shakespeare", "--models", str(models), "--max-new-tokens", "25", "--top-k", "5"]
    generate.main(run + ["--prompt", "ROMEO:\n", "--top-p", "0.9", "--seed", "3"])
    first = capsys.readouterr().out
    assert first.startswith("ROMEO:\n") and len(first) == len("ROMEO:\n") + 25 + 1  # one character a token
    generate.main(run + ["--prompt", "ROMEO:\n", "--top-p", "0.9", "--seed", "3", "--attention", str(tmp_path / "att")])
    assert capsys.readouterr().out == first  # seeded, and drawing its attention changes nothing
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == ["attention.md", "self_attention.png"]
    # what --output may not be
    assert all(any(fnmatch.fnmatchcase(p.name, pattern) for pattern in attention_figures.FIGURE_FILES)
               for p in (tmp_path / "att").iterdir())
    assert "The first 16 tokens of the prompt" in (tmp_path / "att" / "attention.md").read_text()  # its block size
    generate.main(run + ["--prompt", "ROMEO:\n", "--top-p", "0.9", "--seed", "3", "--num-samples", "3"])
    samples = capsys.readouterr().out.split(command.SAMPLE_SEPARATOR + "\n")
    assert len(samples) == 3 and samples[0] == first  # one generator, drawn from in turn: the first is the same
    assert all(s.startswith("ROMEO:\n") and len(s) == len(first) for s in samples) and len(set(samples)) == 3
    generate.main(run + ["--prompt", "ROMEO☃:\n"])
    assert "the prompt: not in the model's vocabulary, read as <unk>: '☃'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate.main(run + ["--prompt", ""])
    assert "--prompt is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # each option at fault named, a translation option refused, not ignored
        generate.main(run + ["--prompt", "RO", "--top-p", "0", "--temperature", "-1", "--beam-size", "3"])
    assert capsys.readouterr().err == (
        "generate: error: --temperature -1.0: must be > 0; --top-p 0.0: must be in (0, 1] (1: no nucleus filter); "
        "--beam-size: not for shakespeare (a language model)\n")


def test_generate_scores_a_text_over_every_token_after_the_first(tmp_path, lm_built, capsys):
    """--score FILE for the LM: the loss over the whole text, blocks of the training length and the tail
    shorter, each read from its own start; bits per character; the attention of the text; clear refusals."""
    import torch.nn.functional as F

    from lib.model import checkpoint
    from lib.use import command, generate

    models = models_dir(lm_built, tmp_path)
    text = PLAY[:16 * 3 + 6]  # three blocks of 16 targets, then 5 more
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    run = ["--task", "shakespeare", "--models", str(models)]
    generate.main(run + ["--score", str(tmp_path / "text.txt"), "--attention", str(tmp_path / "att")])
    scores = json.loads(capsys.readouterr().out)
    assert tuple(scores) == command.LM_SCORES and scores["tokens"] == len(text)  # one character a token

    model, toks, _ = checkpoint.load_trained(models / "model.pt", models / "tokenizer")
    ids = torch.tensor(toks.target.encode(text, add_special_tokens=False).ids)
    with torch.no_grad():
        total = sum(F.cross_entropy(model(ids[None, start:end - 1])[0], ids[start + 1:end], reduction="sum").item()
                    for start, end in [(0, 17), (16, 33), (32, 49), (48, 54)])
    assert scores["loss"] == pytest.approx(total / (len(text) - 1), rel=1e-5)
    assert scores["bits_per_char"] == pytest.approx(scores["loss"] / math.log(2), rel=1e-6)
    assert scores["perplexity"] == pytest.approx(math.exp(scores["loss"]), rel=1e-6)
    assert "The first 16 tokens of the text" in (tmp_path / "att" / "attention.md").read_text()

    def fails(args: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            generate.main(run + args)
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    (tmp_path / "one.txt").write_text("R", encoding="utf-8")
    assert "one.txt: 1 token(s); scoring needs at least 2 (the first is only read)" in fails(
        ["--score", str(tmp_path / "one.txt")])
    assert "--prompt, --top-k: not with --score (it scores the text given; nothing is generated)" in fails(
        ["--score", str(tmp_path / "text.txt"), "--prompt", "RO", "--top-k", "3"])
    assert "generate: error: --seed -9223372036854775809: must be in [-2**63, 2**64) (what torch's generator " \
        "takes)\n" == fails(["--prompt", "RO", "--seed", str(-2 ** 63 - 1)])


def test_generate_refuses_an_output_that_would_replace_what_it_reads(tmp_path, lm_built, capsys, monkeypatch):
    """--output is replaced whole once the inputs are read: naming the --input or --score file (or a link to
    it) lost that text, the sources replaced by their translations. Refused before the model loads; a hard
    link is another name of the file, and stays as it was when --output replaces the other."""
    from lib.use import generate

    models = models_dir(lm_built, tmp_path)
    text = tmp_path / "text.txt"
    text.write_text(PLAY[:40], encoding="utf-8")
    (tmp_path / "link.txt").symlink_to(text)
    for task, args in [("shakespeare", ["--models", str(models), "--score", str(text)]),
                       ("multi30k", ["--models", str(tmp_path / "nowhere"), "--input", str(text)])]:
        option = args[2]
        for output in (text, tmp_path / "link.txt", tmp_path / ".." / tmp_path.name / "text.txt"):
            with pytest.raises(SystemExit) as exit_info:
                generate.main(["--task", task, *args, "--output", str(output)])
            assert exit_info.value.code == 2 and capsys.readouterr().err == (
                f"generate: error: --output {output}: the {option} file; the outputs would replace it (name "
                "another file)\n")
    assert text.read_text(encoding="utf-8") == PLAY[:40]
    os.link(text, tmp_path / "hard.txt")
    generate.main(["--task", "shakespeare", "--models", str(models), "--score", str(text), "--output",
                   str(tmp_path / "hard.txt")])
    assert json.loads((tmp_path / "hard.txt").read_text())["tokens"] == 40
    assert text.read_text(encoding="utf-8") == PLAY[:40]
    monkeypatch.chdir(tmp_path)  # a file named "-" read as ./-: the default --output - is stdout, not that file
    os.link(text, tmp_path / "-")
    generate.main(["--task", "shakespeare", "--models", str(models), "--score", "./-"])
    assert json.loads(capsys.readouterr().out)["tokens"] == 40


def test_generate_writes_nothing_into_the_models_files(tmp_path, lm_built, capsys, monkeypatch):
    """--output models/<task>/model.pt replaced the trained model with the outputs (the next load: "not a
    readable checkpoint"), and a file or --attention's figures put in tokenizer/ would make `dvc repro` take
    that output for changed and run its stage again. Refused before the model loads, links followed, with
    the default models directory too; a file beside model.pt is the user's, and is written."""
    from lib.use import generate

    models = models_dir(lm_built, tmp_path)
    (models / "checkpoints").mkdir()
    text = tmp_path / "text.txt"
    text.write_text(PLAY[:40], encoding="utf-8")
    (tmp_path / "link.pt").symlink_to(models / "model.pt")
    before = {path: path.read_bytes() for path in models.rglob("*") if path.is_file()}
    score = ["--task", "shakespeare", "--models", str(models), "--score", str(text)]
    said = "which the {} stage wrote; writing there would replace or change it (name a path outside it)"
    for option, path, how, stage in [("--output", models / "model.pt", f"is {models / 'model.pt'}", "train"),
                                     ("--output", tmp_path / "link.pt", f"is {models / 'model.pt'}", "train"),
                                     ("--output", models / "tokenizer" / "new.txt", f"is in {models / 'tokenizer'}",
                                      "tokenize"),
                                     ("--attention", models / "tokenizer", f"is {models / 'tokenizer'}", "tokenize"),
                                     ("--attention", models / "checkpoints" / "figures",
                                      f"is in {models / 'checkpoints'}", "train")]:
        with pytest.raises(SystemExit) as exit_info:
            generate.main([*score, option, str(path)])
        assert exit_info.value.code == 2 and capsys.readouterr().err == (
            f"generate: error: {option} {path}: {how}, {said.format(stage)}\n")
    assert {path: path.read_bytes() for path in models.rglob("*") if path.is_file()} == before
    monkeypatch.chdir(tmp_path)  # the default directory, models/<task>
    shutil.copytree(models, tmp_path / "models" / "shakespeare", symlinks=True)
    with pytest.raises(SystemExit):
        generate.main(["--task", "shakespeare", "--score", str(text), "--output", "models/shakespeare/model.pt"])
    assert capsys.readouterr().err == ("generate: error: --output models/shakespeare/model.pt: is "
                                       f"models/shakespeare/model.pt, {said.format('train')}\n")
    generate.main([*score, "--output", str(models / "scores.json")])
    assert json.loads((models / "scores.json").read_text())["tokens"] == 40


def test_a_language_model_loaded_from_python_samples_and_scores_as_the_command_line(tmp_path, lm_built, capsys):
    """lib.use.inference for an LM: the same samples from the same seed (several from one generator), the
    same scores, the causal self-attention, warnings for what it cannot read, errors naming the option."""
    from lib.use import command, generate
    from lib.use.inference import LanguageModel, load

    models = models_dir(lm_built, tmp_path)
    lm = load(models)
    assert isinstance(lm, LanguageModel) and lm.block_size == 16
    run = ["--task", "shakespeare", "--models", str(models), "--prompt", "ROMEO:\n", "--max-new-tokens", "25",
           "--top-k", "5", "--seed", "3", "--num-samples", "2"]
    generate.main(run)
    written = capsys.readouterr().out.split(command.SAMPLE_SEPARATOR + "\n")
    assert lm.sample("ROMEO:\n", max_new_tokens=25, top_k=5, seed=3) + "\n" == written[0]
    generator = torch.Generator().manual_seed(3)
    assert [lm.sample("ROMEO:\n", max_new_tokens=25, top_k=5, seed=generator) + "\n" for _ in range(2)] == written
    pieces = list(lm.stream("ROMEO:\n", max_new_tokens=25, top_k=5, seed=3))
    assert len(pieces) == 25 and "ROMEO:\n" + "".join(pieces) + "\n" == written[0]  # a character a piece

    text = PLAY[:40]
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    generate.main(["--task", "shakespeare", "--models", str(models), "--score", str(tmp_path / "text.txt")])
    assert lm.score(text) == pytest.approx(json.loads(capsys.readouterr().out), rel=1e-9)

    maps = lm.attention(text)
    attention = maps["self-attention"]
    assert list(maps) == ["self-attention"] and attention.rows == attention.cols == list(text[:16])  # its block
    assert len(attention.layers) == 2 and attention.layers[0].shape == (lm.model.cfg.n_heads, 16, 16)
    assert all(torch.all(w.triu(1) == 0) for w in attention.layers)  # no position reads a later one

    with pytest.warns(UserWarning, match="the prompt: not in the model's vocabulary, read as <unk>: '☃'"):
        lm.sample("RO☃", max_new_tokens=2)
    for call, message in [(lambda: lm.sample("RO", temperature=0, top_p=1.5),
                           r"temperature 0: must be > 0; top_p 1.5: must be in \(0, 1\]"),
                          (lambda: lm.sample(""), "prompt: empty"),
                          (lambda: lm.stream("RO", top_k=-1), "top_k -1: must be >= 0"),  # before a token is drawn
                          (lambda: lm.score("R"), r"the text: 1 token\(s\); scoring needs at least 2")]:
        with pytest.raises(ValueError, match=message):
            call()


def test_a_path_starting_with_a_tilde_is_in_the_home_directory(tmp_path, lm_built, monkeypatch, capsys):
    """shakespeare.fetch.source, lib.use.generate's path options and lib.use.inference.load read a leading ~ as
    the shell does, as the home directory: also where the shell leaves it (--models=~/models, from Python)."""
    from lib.use import generate
    from lib.use.inference import load

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where a literal "~" directory would come
    shutil.copyfile(lm_built["source"], tmp_path / "play.txt")
    prepare_text("~/play.txt", tmp_path / "data")
    assert (tmp_path / "data" / "valid.txt").read_text() == (lm_built["data"] / "valid.txt").read_text()
    models_dir(lm_built, tmp_path)
    run = ["--task", "shakespeare", "--models=~/models"]
    generate.main(run + ["--prompt", "RO", "--max-new-tokens", "5", "--seed", "3", "--output=~/sample.txt",
                         "--attention=~/att"])
    assert (tmp_path / "sample.txt").read_text() == load("~/models").sample("RO", max_new_tokens=5, seed=3) + "\n"
    assert (tmp_path / "att" / "attention.md").is_file()
    generate.main(run + ["--score=~/play.txt", "--output=~/scores.json"])
    assert json.loads((tmp_path / "scores.json").read_text())["tokens"] == len(PLAY)
    assert list((tmp_path / "cwd").iterdir()) == [] and capsys.readouterr().err == ""


def test_a_language_model_names_an_argument_of_the_wrong_type_before_any_work(tmp_path, lm_built, monkeypatch):
    """lib.use.inference for an LM: an option, a seed or a text of the wrong type is a TypeError naming it, token ids
    that are none of the vocabulary's a ValueError, before the model runs; a tensor of ids is taken as a list."""
    from lib.use import inference, language_model

    lm = inference.load(models_dir(lm_built, tmp_path))
    ids = lm.tokenizers.target.encode("ROMEO", add_special_tokens=False).ids
    assert lm.attention(torch.tensor(ids))["self-attention"].rows == list("ROMEO") == lm.attention(ids)[
        "self-attention"].rows
    monkeypatch.setattr(language_model, "sampled", lambda *args: pytest.fail("sampling began"))
    monkeypatch.setattr(language_model, "text_metrics", lambda *args: pytest.fail("scoring began"))
    monkeypatch.setattr(lm.model, "forward_with_attention", lambda *args: pytest.fail("the model ran"))
    vocab = lm.model.generator.out_features
    for call, error, message in [
            (lambda: lm.sample("RO", max_new_tokens=2.0), TypeError, "max_new_tokens 2.0: must be an integer"),
            (lambda: lm.stream("RO", temperature="0.8", top_k=2.5),
             TypeError, "temperature '0.8': must be a number; top_k 2.5: must be an integer"),
            (lambda: lm.sample("RO", seed="1"), TypeError, r"seed '1': must be an integer or a torch\.Generator"),
            (lambda: lm.sample("RO", seed=2 ** 64), ValueError,  # was torch's "Overflow when unpacking long long"
             r"seed 18446744073709551616: must be in \[-2\*\*63, 2\*\*64\) \(what torch's generator takes\)"),
            (lambda: lm.sample(b"RO"), TypeError, "prompt: a str, not bytes"),
            (lambda: lm.sample(["RO", "JU"]), TypeError, "prompt: a str, not list"),
            (lambda: lm.score(b"ROMEO"), TypeError, "text: a str, not bytes"),
            (lambda: lm.attention(b"RO"), TypeError, "text: a str or a list of token ids, not bytes"),
            (lambda: lm.attention(""), ValueError, "text: no tokens"),
            (lambda: lm.attention([ids[0], vocab]), ValueError,
             rf"text: {vocab} is not a token id \(an integer in \[0, {vocab}\)\)"),
            (lambda: lm.sampled_ids([]), ValueError, "prompt: no tokens")]:
        with pytest.raises(error, match=message):
            call()


@pytest.mark.parametrize("kind", ["bpe", "word", "char"])
def test_a_continuation_keeps_the_space_after_the_prompt(kind):
    """The text an LM's new tokens add to its prompt is what the whole decoded text gains, a piece a token.
    Decoded alone, the new tokens would lose the space before them: a Metaspace decoder drops a text's
    first space, and words are joined by spaces only between them."""
    cfg = TokenizeConfig(kind=kind, min_frequency=1, vocab_size=80 if kind == "bpe" else 0)
    tok = tokenizer.train_tokenizer(cfg, PLAY.splitlines())
    prompt, text = "ROMEO:", "ROMEO: What say you, friar,"
    ids = tok.encode(prompt, add_special_tokens=False).ids
    new = tok.encode(text, add_special_tokens=False).ids[len(ids):]
    out = list(ids)
    pieces = list(tokenizer.continuation(tok, out, iter(new)))
    assert prompt + "".join(pieces) == text and len(pieces) == len(new) and out == ids + new
    assert (prompt + tok.decode(new) == text) == (kind == "char")  # the new tokens decoded alone


def test_generate_reads_the_prompt_from_stdin_and_shows_the_sample_as_it_is_drawn(tmp_path, lm_built, capsys,
                                                                                  monkeypatch):
    """--prompt - with stdin piped: the whole of it (newlines and all) is the prompt, continued as --prompt
    TEXT is. On stdout the prompt comes first, then each piece as it is drawn, not all at the end."""
    import io

    from lib.use import generate, sample_cli

    run = ["--task", "shakespeare", "--models", str(models_dir(lm_built, tmp_path)), "--max-new-tokens", "12",
           "--top-k", "5", "--seed", "3"]
    prompt = "ROMEO:\nWhat say"
    generate.main(run + ["--prompt", prompt])
    expected = capsys.readouterr().out

    seen = []  # stdout as each piece is drawn
    drawn = sample_cli.continuation

    def watched(*args):
        for piece in drawn(*args):
            seen.append(capsys.readouterr().out)
            yield piece

    monkeypatch.setattr(sample_cli, "continuation", watched)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(prompt.encode())))
    generate.main(run + ["--prompt", "-"])
    seen.append(capsys.readouterr().out)
    assert "".join(seen) == expected
    assert seen[0] == prompt and [len(s) for s in seen[1:]] == [1] * 11 + [2]  # then the last piece and "\n"

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    with pytest.raises(SystemExit) as exit_info:
        generate.main(run + ["--prompt", "-"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "generate: error: --prompt -: stdin is empty; the LM continues a text\n"


def test_generate_continues_each_line_typed_at_a_terminal_as_it_is_entered(tmp_path, lm_built, capsys, monkeypatch):
    """--prompt - at a terminal: each line is a prompt, its samples shown before the next line is read, all
    drawn from the one seeded generator; an empty line is skipped with a word, an unreadable character named
    by its line; an --output file is written at the end. Ctrl-C keeps what was shown."""
    import warnings

    from lib.use import command, generate
    from lib.use.inference import load

    models = models_dir(lm_built, tmp_path)
    run = ["--task", "shakespeare", "--models", str(models), "--max-new-tokens", "12", "--top-k", "5", "--seed", "3",
           "--num-samples", "2", "--prompt", "-"]
    typed = ["ROMEO", "", "JU☃", "FRIAR:"]
    captured = []  # stdout and stderr before each line is read, then at the end
    monkeypatch.setattr(sys, "stdin", Terminal([line.encode() + b"\n" for line in typed],
                                               lambda: captured.append(capsys.readouterr())))
    generate.main(run + ["--attention", str(tmp_path / "att")])
    captured.append(capsys.readouterr())
    shown, err = [c.out for c in captured], "".join(c.err for c in captured)

    lm, generator, separator = load(models), torch.Generator().manual_seed(3), command.SAMPLE_SEPARATOR + "\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the <unk> in line 3, named by generate below
        s = [lm.sample(p, max_new_tokens=12, top_k=5, seed=generator) + "\n" for p in ["ROMEO"] * 2 + ["JU☃"] * 2
             + ["FRIAR:"] * 2]
    assert shown == ["", s[0] + separator + s[1], "", separator + s[2] + separator + s[3],
                     separator + s[4] + separator + s[5], ""]
    assert "continuing each line as you enter it; Ctrl-D to end" in err
    assert "generate: line 2: empty; type a text for the LM to continue" in err
    assert "generate: line 3: not in the model's vocabulary, read as <unk>: '☃'" in err
    assert "The first 16 tokens of the prompt" in (tmp_path / "att" / "attention.md").read_text()

    monkeypatch.setattr(sys, "stdin", Terminal([line.encode() + b"\n" for line in typed], lambda: None))
    generate.main(run + ["--output", str(tmp_path / "out.txt")])
    assert capsys.readouterr().out == "" and (tmp_path / "out.txt").read_text(encoding="utf-8") == separator.join(s)

    def ctrl_c_at(line: int):
        reads = []

        def read():
            reads.append(len(reads) + 1)
            if reads[-1] == line:
                raise KeyboardInterrupt
        return read

    monkeypatch.setattr(sys, "stdin", Terminal([line.encode() + b"\n" for line in typed], ctrl_c_at(2)))
    with pytest.raises(SystemExit) as exit_info:
        generate.main(run)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 130 and out == s[0] + separator + s[1]
    assert err.splitlines()[-1] == "generate: interrupted"


def test_the_guides_python_example_for_the_lm_runs(tmp_path, lm_built, capsys):
    """docs/generate.md, "From Python": its LM part, on the tiny LM trained here; the streamed sample is printed."""
    readme = (ROOT / "docs" / "generate.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    code = 'from lib.use.inference import load\n' + code[code.index('lm = load("models/shakespeare")'):]
    assert '"sonnets.txt"' in code and "lm.stream(" in code
    (tmp_path / "sonnets.txt").write_text(PLAY[:200], encoding="utf-8")
    code = code.replace('"models/shakespeare"', repr(str(models_dir(lm_built, tmp_path))))
    code = code.replace('"sonnets.txt"', repr(str(tmp_path / "sonnets.txt")))
    with pytest.warns(UserWarning, match="read as <unk>: 'l'"):  # the tiny play has no "l" for "What light"
        exec(compile(code, "docs/generate.md", "exec"), {})
    assert len(capsys.readouterr().out) == 200  # the default max_new_tokens, a character each


@pytest.mark.slow  # generate as its own process
def test_generate_stops_quietly_when_the_reader_of_stdout_does(tmp_path, lm_built):
    """`| head`: the sample is streamed, so the reader closing the pipe meets a write; exit 1 and no message
    (not `generate: error: [Errno 32] Broken pipe`)."""
    import subprocess

    command = [sys.executable, "-m", "lib.use.generate", "--task", "shakespeare", "--models",
               str(models_dir(lm_built, tmp_path)), "--prompt", "RO", "--max-new-tokens", "100000"]  # not done in time
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.read(10).startswith(b"RO")
    process.stdout.close()
    assert process.wait(timeout=120) == 1 and process.stderr.read() == b""


def test_every_metric_the_lm_declares_is_one_evaluate_writes(lm_built):
    from lib.tasks.shakespeare import Shakespeare

    assert set(Shakespeare.metric_names()) == set(json.loads(lm_built["metrics"].read_text()))
