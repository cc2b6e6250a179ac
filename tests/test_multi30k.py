"""The multi30k task on a tiny parallel corpus the tests write: loading, bad data, BPE, BLEU, training."""

import fnmatch
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
import warnings
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import yaml

from lib.model import checkpoint
from lib.evaluate import by_length
from lib.evaluate import families as evaluate_families
from lib.evaluate.evaluation import EvaluatePaths
from lib.model import losses
from lib.report.reporting import ReportPaths
from lib.report import attention_maps, reporting
from lib.data import tokenizer
from lib.tasks.writing import run_tokenize
from lib.train import averaging, seq2seq, training
from lib.core.config import ConfigError
from lib.core.sections import ReportConfig
from lib.tasks.params import stage_config
from lib.data.pairs import read_split
from lib.use.inference import Output, Translator, load
from lib.data.sources import sha256
from lib.tasks import multi30k
from lib.tasks.writing import run_fetch
from tests.conftest import ROOT, check_rerunnable, fetch_and_prepare, offline_fetch_line, serving

SHARED = ROOT.parent / "shared" / "data" / "multi30k"

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch.",
          "Kinder spielen am Strand.", "Ein Mädchen isst einen Apfel.", "Der Hund läuft über die Wiese."]
ENGLISH = ["A man rides a bike.", "Two dogs play in the snow.", "A woman reads a book.",
           "Children play on the beach.", "A girl eats an apple.", "The dog runs across the meadow."]


def write_corpus(root: Path, lines: dict[str, list[str]] | None = None) -> Path:
    """The six raw task-1 files; ``lines`` overrides some, by file name ("val.de")."""
    root.mkdir(parents=True, exist_ok=True)
    sizes = {"train": 60, "val": 6, "test_2016_flickr": 6}
    for prefix, n in sizes.items():
        for lang, sentences in (("de", GERMAN), ("en", ENGLISH)):
            text = [sentences[i % len(sentences)] for i in range(n)]
            text = (lines or {}).get(f"{prefix}.{lang}", text)
            data = text if isinstance(text, bytes) else ("\n".join(text) + "\n").encode("utf-8")
            (root / f"{prefix}.{lang}.gz").write_bytes(gzip.compress(data))
    return root


def tiny_params(source: Path, src_lang="de", tgt_lang="en", joint=True) -> dict:
    return {
        "tasks": ["multi30k"],
        "multi30k": {
            "fetch": {"source": str(source), "languages": ["de", "en"]},
            "prepare": {"src_lang": src_lang, "tgt_lang": tgt_lang},
            "tokenize": {"kind": "bpe", "vocab_size": 120, "min_frequency": 1, "joint": joint},
            "train": {
                "seed": 0, "device": "cpu", "epochs": 2, "max_tokens": 200, "lr_factor": 1.0, "warmup": 5,
                "label_smoothing": 0.1, "clip_norm": 1.0, "checkpoint_every": 2, "average_last": 2,
                "model": {"d_model": 16, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 32,
                          "dropout": 0.1, "norm_first": False, "tie_embeddings": True, "fused_qkv": True,
                          "max_len": 64},
            },
            "evaluate": {"max_tokens": 400, "max_extra_tokens": 5, "n_samples": 3},
            "report": {"n_attention_examples": 2},
        },
    }


def cfg(params, stage):
    return stage_config(params, "multi30k", stage)


def prepare(params, out: Path) -> Path:
    """fetch and prepare, as `dvc repro` runs them; the fetched files' directory."""
    return fetch_and_prepare("multi30k", cfg(params, "fetch"), cfg(params, "prepare"), out)


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "raw")


def test_local_loader_reads_every_split_nfc_and_stripped(tmp_path, corpus):
    decomposed = unicodedata.normalize("NFD", "  Ein Mädchen läuft.  ")  # a + combining diaeresis
    # Saved by a Windows editor: a byte-order mark, "\r\n"; a form feed within a line (where str.splitlines breaks)
    english = [ENGLISH[0], ENGLISH[1].replace(" ", "\x0c", 1)] + ENGLISH[2:]
    write_corpus(corpus, {"val.de": [decomposed] + GERMAN[1:],
                          "val.en": "\ufeff".encode() + "".join(line + "\r\n" for line in english).encode()})
    prepare(tiny_params(corpus), tmp_path / "data")
    splits = {s: pd.read_parquet(tmp_path / "data" / f"{s}.parquet") for s in ("train", "valid", "test")}
    assert [len(f) for f in splits.values()] == [60, 6, 6]
    assert list(splits["train"].columns) == ["src", "tgt"]
    assert splits["train"]["src"][1] == GERMAN[1] and splits["train"]["tgt"][1] == ENGLISH[1]
    assert splits["valid"]["src"][0] == "Ein Mädchen läuft." == unicodedata.normalize("NFC", "Ein Mädchen läuft.")
    assert splits["valid"]["tgt"].tolist() == english


def test_two_params_turn_it_into_english_to_german(tmp_path, corpus):
    prepare(tiny_params(corpus, "en", "de"), tmp_path / "data")
    train = pd.read_parquet(tmp_path / "data" / "train.parquet")
    assert train["src"][0] == ENGLISH[0] and train["tgt"][0] == GERMAN[0]


@pytest.mark.parametrize("override, message", [
    ({"val.en": ENGLISH[:5]}, r"val\.de\.gz has 6 lines but .*val\.en\.gz has 5: not parallel"),
    ({"train.de": GERMAN[:2] + ["   "] + GERMAN[3:]}, r"train\.de\.gz: line 3: empty line"),
    ({"test_2016_flickr.en": b"A man.\nA \xff dog.\n"}, r"test_2016_flickr\.en\.gz: line 2: not UTF-8"),
    ({"val.de": b"", "val.en": b""}, r"val\.de\.gz: empty file"),
])
def test_bad_data_is_named_and_leaves_the_earlier_data(tmp_path, corpus, override, message):
    out = tmp_path / "data"
    prepare(tiny_params(corpus), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_corpus(corpus, override)
    with pytest.raises(ValueError, match=message):
        prepare(tiny_params(corpus), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no half-written directory


@pytest.mark.slow  # a stage as its own process
def test_missing_file_fails_the_fetch_stage_with_one_line(tmp_path, corpus):
    (corpus / "val.en.gz").unlink()
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params(corpus)))
    result = subprocess.run([sys.executable, "-m", "stages.fetch", "multi30k", "--out", str(tmp_path / "sources"),
                             "--params", str(params)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().endswith("val.en.gz: missing (multi30k.fetch.source must hold the raw task-1 files "
                                          "of multi30k.fetch.languages ['de', 'en'])")
    assert "Traceback" not in result.stderr and not (tmp_path / "sources").exists()


@pytest.mark.parametrize("damage", ["cut", "flipped", "plain"])
def test_a_damaged_gzip_file_is_named(tmp_path, corpus, damage):
    packed = (corpus / "train.en.gz").read_bytes()
    broken = {"cut": packed[:len(packed) // 2],
              "flipped": packed[:-6] + bytes([packed[-6] ^ 0xFF]) + packed[-5:],  # the CRC-32 no longer matches
              "plain": b"A man rides a bike.\n"}[damage]
    (corpus / "train.en.gz").write_bytes(broken)
    with pytest.raises(ValueError, match=r"train\.en\.gz: not a whole gzip file \("):
        prepare(tiny_params(corpus), tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_a_download_is_checked_against_the_published_sums(tmp_path, corpus, monkeypatch):
    """A URL source downloads each raw file and checks its sha256 (here the tiny corpus's, standing in for the
    published ones): the same data as the local copy. A file whose sum differs, or one the server lacks, is
    one error naming the URL, and leaves nothing behind, not even the files that did match."""
    sums = {path.name: sha256(path) for path in corpus.iterdir()}
    monkeypatch.setattr(multi30k, "SHA256", sums)
    with serving(corpus) as url:
        prepare(tiny_params(url), tmp_path / "downloaded")
        prepare(tiny_params(corpus), tmp_path / "copied")
        for split in ("train", "valid", "test"):
            assert read_split(tmp_path / "downloaded", split).equals(read_split(tmp_path / "copied", split))
        manifest = json.loads((tmp_path / "downloaded_sources" / "manifest.json").read_text())
        assert manifest == {"source": url, "files": sums}
        monkeypatch.setitem(sums, "val.en.gz", "0" * 64)
        with pytest.raises(ConfigError, match=rf"^multi30k\.fetch\.source: {url}/val\.en\.gz: its sha256 is "
                                              rf"{sha256(corpus / 'val.en.gz')}, not the published 0{{64}} "):
            run_fetch("multi30k", cfg(tiny_params(url), "fetch"), tmp_path / "checked")
        monkeypatch.setitem(sums, "val.en.gz", sha256(corpus / "val.en.gz"))
        (corpus / "test_2016_flickr.de.gz").unlink()
        with pytest.raises(ConfigError, match=rf"could not download {url}/test_2016_flickr\.de\.gz \(HTTP Error 404"):
            run_fetch("multi30k", cfg(tiny_params(url), "fetch"), tmp_path / "checked")
    assert not (tmp_path / "checked").exists() and not list(tmp_path.glob(".checked*"))


@pytest.mark.slow  # a stage as its own process
def test_offline_the_fetch_stage_says_what_to_do_in_one_line(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params("http://127.0.0.1:9/multi30k")))  # a closed port
    result = subprocess.run([sys.executable, "-m", "stages.fetch", "multi30k", "--out", str(tmp_path / "sources"),
                             "--params", str(params)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "fetch@multi30k: error: multi30k.fetch.source: could not download http://127.0.0.1:9/multi30k/train.de.gz "
        "(Connection refused); without internet, point multi30k.fetch.source at a local directory holding the raw "
        "task-1 files: dvc exp run -S multi30k.fetch.source=/path/to/copy")
    assert not (tmp_path / "sources").exists()


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/data/multi30k on this machine")
def test_the_pinned_sums_are_those_of_the_official_files():
    """The team's local copy is the official files (git blob ids checked against github.com/multi30k/dataset)."""
    for path in sorted(SHARED.glob("*.gz")):
        assert multi30k.SHA256[path.name] == sha256(path), path.name


def hub_folder(root: Path, languages=("de", "en")) -> Path:
    """A local data set in the hub's shape: train/validation/test JSON-lines files, a column per language."""
    root.mkdir()
    sizes = {"train": 12, "validation": 6, "test": 6}
    for split, n in sizes.items():
        rows = [{lang: {"de": GERMAN, "en": ENGLISH}[lang][i % 6] for lang in languages} for i in range(n)]
        (root / f"{split}.jsonl").write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return root


def test_a_hub_shaped_folder_goes_through_datasets(tmp_path, monkeypatch):
    """Through datasets.load_dataset itself: each split's language columns, in order; a language the data
    set lacks is named with those it has, and a pair that was not fetched names the param to add it to."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # its cache, not the user's
    folder = hub_folder(tmp_path / "hub")
    prepare(tiny_params(folder, "en", "de"), tmp_path / "data")
    valid = read_split(tmp_path / "data", "valid")
    assert valid["src"].tolist() == ENGLISH and valid["tgt"].tolist() == GERMAN
    assert len(read_split(tmp_path / "data", "train")) == 12
    params = tiny_params(folder)
    params["multi30k"]["fetch"]["languages"] = ["de", "fr"]
    with pytest.raises(ConfigError, match=r"^multi30k\.fetch\.languages: 'fr' is not in .*hub \(its train split "
                                          r"has: de, en\)$"):
        run_fetch("multi30k", cfg(params, "fetch"), tmp_path / "other")
    params = tiny_params(folder, "fr", "en")
    with pytest.raises(ConfigError, match=r"^multi30k\.prepare\.src_lang: 'fr' was not fetched \(the source files "
                                          r"hold de, en\): add it to multi30k\.fetch\.languages$"):
        prepare(params, tmp_path / "other")
    assert not (tmp_path / "other").exists()


@pytest.mark.slow  # a stage as its own process
def test_an_unreachable_hub_data_set_is_one_line_naming_it(tmp_path):
    line = offline_fetch_line("multi30k", tiny_params("someone/multi30k@0123abc"), tmp_path)
    assert line.startswith("fetch@multi30k: error: multi30k.fetch.source: could not load 'someone/multi30k@0123abc' "
                           "as a Hugging Face data set (") and line.endswith("dvc exp run -S multi30k.fetch.source="
                                                                             "/path/to/copy")


def test_a_missing_local_directory_names_the_ways_to_give_one(tmp_path):
    with pytest.raises(ConfigError, match=r"^multi30k\.fetch\.source: \.\./nowhere/multi30k: no such directory "
                                          r"\(give the raw files' URL"):
        run_fetch("multi30k", cfg(tiny_params("../nowhere/multi30k"), "fetch"), tmp_path / "sources")


@pytest.mark.parametrize("joint, split_punctuation", [(True, False), (False, False), (True, True)])
def test_bpe_round_trips_and_specials_come_from_the_artifact(tmp_path, corpus, joint, split_punctuation):
    params = tiny_params(corpus, joint=joint)
    params["multi30k"]["tokenize"]["split_punctuation"] = split_punctuation
    prepare(params, tmp_path / "data")
    run_tokenize("multi30k", cfg(params, "tokenize"), tmp_path / "data", tmp_path / "tok")
    files = sorted(p.name for p in (tmp_path / "tok").iterdir())
    assert files == (["tokenizer.json"] if joint else ["source.json", "target.json"])
    toks = tokenizer.load_tokenizers(tmp_path / "tok")
    assert toks.joint == joint
    ids = tokenizer.special_ids(toks)
    for side in (toks.source, toks.target):
        assert [side.token_to_id(t) for t in tokenizer.SPECIAL_TOKENS] == [ids.pad, ids.bos, ids.eos, ids.unk]
    test = pd.read_parquet(tmp_path / "data" / "test.parquet")
    pairs = tokenizer.encode_pairs(toks, test)
    assert tokenizer.decode(toks.source, pairs.src) == test["src"].tolist()
    assert tokenizer.decode(toks.target, pairs.tgt) == test["tgt"].tolist()
    if not joint:  # each side learned from its own language only
        assert toks.source.token_to_id("▁Hund") is not None and toks.target.token_to_id("▁Hund") is None
    glued = [t for t in toks.source.get_vocab() if re.search(r"\w", t) and re.search(r"[^\w▁<>]", t)]
    if split_punctuation:  # "Fahrrad." is "▁Fahrrad" "." and no piece glues a mark to a word
        assert toks.source.encode("Fahrrad.", add_special_tokens=False).tokens[-1] == "." and not glued
    else:  # Metaspace alone merges a word's end with its full stop ("e." among the first merges here)
        assert glued


def test_bleu_and_chrf_on_a_known_example():
    # By hand: 1- to 4-gram precisions 5/6, 3/5, 2/4, 1/3, no brevity penalty: (1/12) ** (1/4).
    scores = multi30k.Multi30k().score(["the cat sat on a mat"], ["the cat sat on the mat"])
    assert scores["bleu"] == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-6)
    assert "tok:13a" in scores["bleu_signature"] and "case:mixed" in scores["bleu_signature"]
    assert multi30k.Multi30k().score(["A dog."], ["A dog."])["chrf"] == pytest.approx(100.0)
    assert multi30k.Multi30k().sentence_score("a b c d", "a b c d") == pytest.approx(100.0)


def test_bleu_by_source_length_groups_sentences_by_their_words():
    assert [by_length.length_group(" ".join("w" * n)) for n in (1, 7, 8, 9, 10, 16, 17, 40)] == [
        "01-07", "01-07", "08-09", "08-09", "10-11", "14-16", "17+", "17+"]
    sources = ["ein Hund", "ein Hund läuft", " ".join(["Wort"] * 17)]
    # The first group's BLEU is the corpus BLEU of its two sentences alone.
    hypotheses = ["the cat sat on a mat", "a b c d", "x y z w v"]
    references = ["the cat sat on the mat", "a b c d", "x y z w v"]
    table = by_length.score_by_source_length(multi30k.Multi30k(), sources, hypotheses, references)
    assert table["group"].tolist() == ["01-07", "17+"] and table["length"].tolist() == [1, 17]  # empty ones left out
    assert table["sentences"].tolist() == [2, 1]
    groups = dict(zip(table["group"], table["bleu"]))
    assert groups["01-07"] == pytest.approx(multi30k.Multi30k().score(hypotheses[:2], references[:2])["bleu"])
    assert groups["17+"] == pytest.approx(100.0)


def build(tmp_path, params, name="run"):
    paths = (tmp_path / "data", tmp_path / "tok", tmp_path / name / "model.pt", tmp_path / name / "ckpt",
             tmp_path / name / "live")
    if not paths[0].exists():
        prepare(params, paths[0])
        run_tokenize("multi30k", cfg(params, "tokenize"), paths[0], paths[1])
    return paths


@pytest.mark.slow  # two whole pipelines
@pytest.mark.parametrize("joint", [True, False])
def test_trains_evaluates_and_ties_embeddings(tmp_path, corpus, joint):
    params = tiny_params(corpus, joint=joint)
    paths = build(tmp_path, params)
    summary = training.run("multi30k", cfg(params, "train"), *paths)
    model, state = checkpoint.load_model(paths[2])
    assert model.generator.weight is model.tgt_embed.tokens.weight
    assert (model.src_embed.tokens.weight is model.tgt_embed.tokens.weight) == joint
    assert state["joint_vocab"] == joint and summary["step"] > 0
    check_rerunnable({("prepare", "out"): paths[0], ("tokenize", "out"): paths[1], ("train", "checkpoints"): paths[3],
                      ("train", "live"): paths[4]}, "multi30k")  # source.json and target.json, when not joint
    params["multi30k"]["evaluate"]["beam_size"] = 3
    reports = tmp_path / "reports" / "multi30k"
    metrics = evaluate_families.run("multi30k", cfg(params, "evaluate"), EvaluatePaths(
        data=paths[0], tokenizer=paths[1], model=paths[2], metrics=reports / "metrics.json", samples=reports /
        "samples.jsonl", lengths=reports / "by_length.csv"))
    assert {"bleu", "chrf", "bleu_signature", "seconds"} <= set(metrics["greedy"]) <= set(metrics["beam3"])
    assert metrics["valid_perplexity"] > 1.0
    # Whose fault the wrong outputs are, recomputed through lib.use.inference: each search is judged as it ranks,
    # greedy search by probability (alpha 0), beam search by its length-penalised score.
    translator = Translator(*checkpoint.load_trained(paths[2], paths[1])[:2])
    test = read_split(paths[0], "test")
    sources, references = test["src"].tolist(), test["tgt"].tolist()
    for search, beam_size, alpha in (("greedy", 1, 0.0), ("beam3", 3, metrics["beam3"]["alpha"])):
        found = [outputs[0] for outputs in translator.n_best(sources, 1, beam_size, alpha, max_extra_tokens=5)]
        missed = [f.text != r.text and r.score > f.score + 1e-4
                  for f, r in zip(found, translator.score(sources, references, alpha))]
        assert metrics[search]["search_errors"] == pytest.approx(sum(missed) / len(sources)), search
    reporting.run("multi30k", ReportConfig(n_attention_examples=2), ReportPaths(
                      data=paths[0], tokenizer=paths[1], model=paths[2], metrics=reports / "metrics.json",
                      samples=reports / "samples.jsonl", lengths=reports / "by_length.csv",
                      live=paths[4], out=reports / "report.md", figures=reports / "figures",
                      losses=reports / "losses.csv"))
    text = (reports / "report.md").read_text()
    assert "| greedy" in text and "| beam3" in text and "bleu signature" in text  # searches side by side
    alpha_row = next(line for line in text.splitlines() if line.startswith("| alpha"))
    assert alpha_row.split("|")[3].strip() == f"{metrics['beam3']['alpha']:.4f}"  # beam's own score, greedy's blank
    links = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    # curves, BLEU by epoch, 3 heatmaps per attention example, BLEU by source length
    assert len(links) == 1 + 1 + 2 * 3 + 1
    by_length = pd.read_csv(reports / "by_length.csv")  # the tiny corpus's sentences have 4-6 words:
    assert by_length.to_dict("list") == {"group": ["01-07"], "length": [1], "sentences": [6],
                                         "bleu": [metrics["greedy"]["bleu"]]}
    assert not any("by_length" in key for key in metrics)  # a plot, not a metric each
    for link in links:
        assert (reports / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<td>greedy.bleu</td>" in (reports / "card.html").read_text()


def test_time_budget_stops_and_a_rerun_resumes_to_the_same_steps(tmp_path, corpus):
    params = tiny_params(corpus)
    straight = training.run("multi30k", cfg(params, "train"), *build(tmp_path, params, "straight"))
    params["multi30k"]["train"]["time_budget_minutes"] = 1e-6  # stops after the first epoch
    paths = build(tmp_path, params, "resumed")
    first = training.run("multi30k", cfg(params, "train"), *paths)
    assert checkpoint.load(paths[3] / "last.pt")["epoch"] == 1 and first["step"] < straight["step"]
    params["multi30k"]["train"]["time_budget_minutes"] = 0  # a stop param: changing it continues the run
    second = training.run("multi30k", cfg(params, "train"), *paths)
    assert second["resumed"] and second["step"] == straight["step"]
    a = checkpoint.load(tmp_path / "straight" / "ckpt" / "last.pt")["model"]
    b = checkpoint.load(paths[3] / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_stop_reasons():
    params = tiny_params(Path("x"))["multi30k"]["train"]
    params.update(epochs=10, max_steps=500, time_budget_minutes=1.0, patience=3)
    train_cfg = cfg({"tasks": ["multi30k"], "multi30k": {"train": params}}, "train")
    state = {"epoch": 4, "step": 499, "elapsed_s": 30.0, "epochs_since_best": 2}
    assert seq2seq.stop_reason(train_cfg, state) is None
    for param, change in [("max_steps", {"step": 500}), ("time_budget_minutes", {"elapsed_s": 61.0}),
                          ("patience", {"epochs_since_best": 3}), ("epochs", {"epoch": 10})]:
        named, text = seq2seq.stop_reason(train_cfg, {**state, **change})
        assert named == param and f"train.{param}" in text


def test_average_weights_is_the_elementwise_mean(tmp_path):
    for i, value in enumerate((1.0, 2.0, 6.0)):
        checkpoint.save({"model": {"w": torch.full((2, 2), value), "n": torch.tensor([i])}}, tmp_path / f"{i}.pt")
    mean = averaging.average_weights([tmp_path / f"{i}.pt" for i in range(3)])
    assert torch.equal(mean["w"], torch.full((2, 2), 3.0)) and mean["n"].dtype == torch.long


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/data/multi30k on this machine")
def test_real_multi30k_loads_and_bpe_round_trips(tmp_path):
    params = tiny_params(SHARED)
    params["multi30k"]["tokenize"] = yaml.safe_load((ROOT / "params.yaml").read_text())["multi30k"]["tokenize"]
    prepare(params, tmp_path / "data")
    sizes = {s: len(pd.read_parquet(tmp_path / "data" / f"{s}.parquet")) for s in ("train", "valid", "test")}
    assert sizes == {"train": 29000, "valid": 1014, "test": 1000}
    toks = run_tokenize("multi30k", cfg(params, "tokenize"), tmp_path / "data", tmp_path / "tok")
    test = pd.read_parquet(tmp_path / "data" / "test.parquet")
    for side, column in ((toks.source, "src"), (toks.target, "tgt")):
        texts = test[column].tolist()
        decoded = tokenizer.decode(side, tokenizer.encode(side, texts))
        assert sum(d == t for d, t in zip(decoded, texts)) / len(texts) >= 0.999


@pytest.mark.parametrize("joint, source_eos", [(True, True), (False, True), (True, False)])
def test_source_eos_ends_every_source_the_model_reads(tmp_path, corpus, monkeypatch, joint, source_eos):
    """tokenize.source_eos is kept in the tokenizer file (its source side's post-processor), so training,
    evaluation and lib.use.generate all give the model the same sources; targets never get the <eos>."""
    from lib.use import lines
    from transformer.decoding import Hypothesis

    params = tiny_params(corpus, joint=joint)
    params["multi30k"]["tokenize"]["source_eos"] = source_eos
    data, tok, *_ = build(tmp_path, params)
    toks = tokenizer.load_tokenizers(tok)
    eos = tokenizer.special_ids(toks).eos
    pairs = tokenizer.encode_pairs(toks, read_split(data, "train"))
    assert [s[-1] == eos for s in pairs.src] == [source_eos] * len(pairs.src)
    assert not any(eos in s[:-1] for s in pairs.src) and not any(eos in t for t in pairs.tgt)
    seen = []
    monkeypatch.setattr(lines, "translate_n_best", lambda _, sources, *args: seen.extend(sources) or
                        [[Hypothesis([], 0.0, 0.0, True)]] * len(sources))
    lines.translate_lines(SimpleNamespace(cfg=SimpleNamespace(max_len=64)), toks, GERMAN[:2], 1, 0.0, 5, 1000)
    assert seen == tokenizer.encode_pairs(toks, pd.DataFrame({"src": GERMAN[:2], "tgt": ["", ""]})).src


@pytest.fixture
def trained(tmp_path, corpus):
    """A tiny trained model laid out as the pipeline writes it: models/multi30k/{model.pt,tokenizer/}."""
    params = tiny_params(corpus)
    data, tok, model, ckpt, live = build(tmp_path, params)
    training.run("multi30k", cfg(params, "train"), data, tok, model, ckpt, live)
    models = tmp_path / "models" / "multi30k"
    models.mkdir(parents=True)
    shutil.copytree(tok, models / "tokenizer")
    shutil.copyfile(model, models / "model.pt")
    return models


def test_generate_translates_a_file_line_by_line(tmp_path, trained, capsys):
    from lib.use import generate

    # Characters never seen in training (<unk>), an empty line, an over-long one.
    lines = [GERMAN[0] + " ☃ 北京", "", " ".join(["Hund"] * 80), GERMAN[1]]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "one.txt").write_text(GERMAN[1] + "\n", encoding="utf-8")
    for beam in ("1", "3"):
        run = ["--task", "multi30k", "--models", str(trained), "--beam-size", beam]
        generate.main(run + ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")])
        out = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
        assert len(out) == 5 and out[4] == ""  # one line per input line
        assert out[1] == "" and out[2] == ""
        generate.main(run + ["--input", str(tmp_path / "one.txt"), "--output", str(tmp_path / "one.out")])
        assert (tmp_path / "one.out").read_text(encoding="utf-8") == out[3] + "\n"  # alone or in a batch
        err = capsys.readouterr().err
        assert re.search(r"line 3: \d+ tokens, more than the model's max_len 64", err)
        assert "line 1: not in the model's vocabulary, read as <unk>: '☃', '北京'" in err  # adjacent ones joined
        assert "line 4:" not in err


def test_generate_writes_each_lines_n_best_with_the_scores_beam_search_ranked_them_by(tmp_path, trained):
    """--n-best K: a table of each translated line's K best outputs, best first; rank 1 is the plain output,
    and each score is the model's own log-probability of that output over the length penalty."""
    from lib.use import command, generate, lines
    from transformer.decoding import length_penalty
    from lib.evaluate.decode import score_outputs
    from lib.data.tokenizer import encode_sources, special_ids

    (tmp_path / "in.txt").write_text("\n".join([GERMAN[0], "", GERMAN[1]]) + "\n", encoding="utf-8")
    run = ["--task", "multi30k", "--models", str(trained), "--input", str(tmp_path / "in.txt"), "--beam-size", "4",
           "--alpha", "0.6"]
    generate.main(run + ["--output", str(tmp_path / "best.txt")])
    generate.main(run + ["--output", str(tmp_path / "n_best.tsv"), "--n-best", "3"])
    best = (tmp_path / "best.txt").read_text(encoding="utf-8").split("\n")
    table = pd.read_csv(tmp_path / "n_best.tsv", sep="\t", keep_default_na=False)
    assert tuple(table.columns) == command.N_BEST_COLUMNS
    assert table["line"].tolist() == [1, 1, 1, 3, 3, 3] and table["rank"].tolist() == [1, 2, 3] * 2  # no empty line
    assert table[table["rank"] == 1]["translation"].tolist() == [best[0], best[2]]

    model, toks, _ = checkpoint.load_trained(trained / "model.pt", trained / "tokenizer")
    ids = special_ids(toks)
    for (line, rows), german in zip(table.groupby("line"), [GERMAN[0], GERMAN[1]]):
        assert rows["score"].is_monotonic_decreasing
        source = encode_sources(toks, [german])[0].ids
        _, _, written = lines.translate_lines(model, toks, [german], 4, 0.6, 20, 8192, n_best=3)
        hypotheses = written[0][1]
        assert len({tuple(h.tokens) for h in hypotheses}) == 3  # distinct outputs (a tiny model's may read alike)
        rescored = score_outputs(model, [source] * 3, [h.tokens for h in hypotheses], ids, 8192, 0.6,
                                 [h.eos for h in hypotheses])  # teacher-forced
        for row, h, again in zip(rows.itertuples(), hypotheses, rescored):
            assert toks.target.decode(h.tokens) == row.translation
            assert (row.tokens, row.eos) == (len(h.tokens) + h.eos, h.eos)
            assert (row.score, row.log_prob) == pytest.approx((again.score, again.log_prob), abs=1e-3)
            assert row.score == pytest.approx(row.log_prob / length_penalty(row.tokens, 0.6), abs=1e-3)


def test_generate_scores_given_outputs_as_the_model_would(tmp_path, trained, capsys):
    """--score FILE: each given output (a reference, say) scored beside its source line: its log-probability
    is minus the summed cross-entropy training's own loss gives it; lines it cannot use are named."""
    from lib.use import command, generate
    from lib.data.pairs import Pairs, collate
    from transformer.decoding import length_penalty
    from transformer.masks import padding_mask, target_mask
    from lib.data.tokenizer import encode, encode_sources, special_ids

    (tmp_path / "in.txt").write_text("\n".join([GERMAN[0], "", GERMAN[1], GERMAN[2]]) + "\n", encoding="utf-8")
    references = [ENGLISH[0], ENGLISH[1], ENGLISH[1] + " ☃", " ".join(["dog"] * 80)]
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n", encoding="utf-8")
    run = ["--task", "multi30k", "--models", str(trained), "--input", str(tmp_path / "in.txt")]
    generate.main(run + ["--score", str(tmp_path / "ref.txt"), "--output", str(tmp_path / "scores.tsv")])
    err = capsys.readouterr().err
    assert "line 3: the --score output: not in the model's vocabulary, read as <unk>: '☃'" in err
    assert re.search(r"line 4: the --score output has \d+ tokens and an eos, more than the model's max_len 64", err)
    table = pd.read_csv(tmp_path / "scores.tsv", sep="\t", keep_default_na=False)
    assert tuple(table.columns) == command.SCORE_COLUMNS
    assert table["line"].tolist() == [1, 3] and table["translation"][0] == ENGLISH[0]  # no row for an empty source

    model, toks, _ = checkpoint.load_trained(trained / "model.pt", trained / "tokenizer")
    ids = special_ids(toks)
    for row, german, english in zip(table.itertuples(), [GERMAN[0], GERMAN[1]], [ENGLISH[0], ENGLISH[1] + " ☃"]):
        [output] = encode(toks.target, [english])
        pair = Pairs([encode_sources(toks, [german])[0].ids], [output])
        assert row.tokens == len(output) + 1
        assert row.log_prob == pytest.approx(-losses.mean_loss(model, pair, ids, 8192, "cpu") * row.tokens, abs=1e-3)
        assert row.score == pytest.approx(row.log_prob / length_penalty(row.tokens, 0.6), abs=1e-3)
        with torch.no_grad():  # each token's log-probability, the eos's last: the least likely one is named
            batch = collate(pair, [0], ids)
            logits = model(batch.src, batch.tgt_in, padding_mask(batch.src, ids.pad),
                           target_mask(batch.tgt_in, ids.pad))
            token_log_probs = torch.log_softmax(logits[0], -1).gather(1, batch.tgt_out[0, :, None])[:, 0]
        j = int(token_log_probs.argmin())
        piece, value = row.least_likely.rsplit(" ", 1)
        assert piece == (toks.target.id_to_token(output[j]) if j < len(output) else "<eos>")
        assert float(value) == pytest.approx(token_log_probs[j].item(), abs=0.006)

    def fails(args: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            generate.main(run + args)
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    (tmp_path / "short.txt").write_text(ENGLISH[0] + "\n", encoding="utf-8")
    assert "--score has 1 lines but --input has 4: they must be parallel" in fails(
        ["--score", str(tmp_path / "short.txt"), "--output", str(tmp_path / "scores.tsv")])
    assert "--beam-size, --n-best: not with --score (it scores the text given; nothing is generated)" in fails(
        ["--score", str(tmp_path / "ref.txt"), "--beam-size", "4", "--n-best", "2"])
    with pytest.raises(SystemExit):
        generate.main(["--task", "multi30k", "--models", str(trained), "--input", "-", "--score", "-"])
    assert "--input and --score cannot both be stdin" in capsys.readouterr().err
    assert pd.read_csv(tmp_path / "scores.tsv", sep="\t")["line"].tolist() == [1, 3]  # the earlier table kept


def test_attention_drawn_again_clears_the_last_runs_figures(tmp_path):
    """An --attention directory drawn again shows one run: an earlier run's figures that this one did not draw
    (three lines then, one now; an LM's self_attention.png) stayed beside the new ones, attention.md no longer
    naming them. They go; files by other names stay; no temporary is left."""
    from lib.use import attention_figures

    out = tmp_path / "figs"
    out.mkdir()
    for name in ("attention.md", "cross_attention_line1.png", "cross_attention_line3.png", "self_attention.png",
                 "notes.txt"):
        (out / name).write_text("earlier")
    (out / "kept_attention_line2.png").mkdir()  # a directory by a figure's name: not generate's, left

    def draw(figures):
        (figures / "cross_attention_line1.png").write_text("now")
        return ["# Attention"]
    attention_figures.write_figures(out, draw)
    assert {p.name: p.read_text() for p in out.iterdir() if p.is_file()} == {
        "attention.md": "# Attention", "cross_attention_line1.png": "now", "notes.txt": "earlier"}
    assert (out / "kept_attention_line2.png").is_dir() and os.listdir(tmp_path) == ["figs"]


def test_generate_draws_the_attention_that_wrote_each_output(tmp_path, trained, capsys, monkeypatch):
    """--attention DIR: per translated line, the three kinds of attention of the model teacher-forced on its
    own output, cut to the line's real lengths (the same weights as that line run alone, unpadded), rows
    labelled by the output's tokens and <eos>; empty lines drawn never; nothing left half-written."""
    from lib.report import figures
    from lib.use import attention_figures, generate
    from lib.data.pairs import Pairs, collate
    from lib.model.translate import greedy_translate
    from lib.data.tokenizer import encode_sources, special_ids

    drawn = {}
    real = figures.example_heatmaps
    monkeypatch.setattr(figures, "example_heatmaps", lambda maps, i, src, tgt_in, predicted, title, *rest: drawn.update(
        {title: ({k: [w[i] for w in v] for k, v in maps.items()}, src, predicted)})
        or real(maps, i, src, tgt_in, predicted, title, *rest))
    (tmp_path / "in.txt").write_text("\n".join([GERMAN[0], "", GERMAN[1]]) + "\n", encoding="utf-8")
    out_dir = tmp_path / "attention"
    generate.main(["--task", "multi30k", "--models", str(trained), "--input", str(tmp_path / "in.txt"),
                   "--output", str(out_dir / "out.txt"), "--attention", str(out_dir)])
    outputs = (out_dir / "out.txt").read_text(encoding="utf-8").split("\n")
    pngs = [f"{kind}_attention_line{n}.png" for kind in ("cross", "decoder_self", "encoder_self") for n in (1, 3)]
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(["attention.md", "out.txt", *pngs])  # out.txt: ours
    # what --output may not be
    assert all(any(fnmatch.fnmatchcase(p.name, pattern) for pattern in attention_figures.FIGURE_FILES)
               for p in out_dir.iterdir() if p.name != "out.txt")
    assert all((out_dir / name).stat().st_size > 0 for name in os.listdir(out_dir))
    page = (out_dir / "attention.md").read_text(encoding="utf-8")
    assert f"- output: `{outputs[2]}`" in page and "## Line 2" not in page and "](./cross_attention_line3.png)" in page
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".attention")]  # no temporary left

    model, toks, _ = checkpoint.load_trained(trained / "model.pt", trained / "tokenizer")
    ids = special_ids(toks)
    maps, src, labels = drawn["line 3"]
    source = encode_sources(toks, [GERMAN[1]])[0].ids
    [output] = greedy_translate(model, [source], ids, 8192, 20)  # generate's defaults: greedy, 20 extra tokens
    assert toks.target.decode(output) == outputs[2]
    assert src == [toks.source.id_to_token(t) for t in source]
    assert labels == [toks.target.id_to_token(t) for t in output] + ["<eos>"]
    alone, _ = attention_maps.attention_maps(model, collate(Pairs([source], [output]), [0], ids), ids)
    for kind, layers in alone.items():
        for layer, weights in enumerate(layers):  # (1, H, rows, columns): this line's real lengths
            rows, columns = weights.shape[-2:]
            torch.testing.assert_close(maps[kind][layer][:, :rows, :columns], weights[0], msg=kind)

    before = (out_dir / "out.txt").read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        generate.main(["--task", "multi30k", "--models", str(trained), "--input", str(tmp_path / "in.txt"),
                       "--output", str(out_dir / "out.txt"), "--attention", str(tmp_path / "in.txt")])
    assert "generate: error: --attention " in capsys.readouterr().err
    assert (out_dir / "out.txt").read_text(encoding="utf-8") == before


def test_generate_reads_stdin_and_names_what_it_cannot_use(tmp_path, trained, capsys, monkeypatch):
    import io

    from lib.use import generate

    def stdin(data: bytes):
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))

    def fails(args: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            generate.main(["--task", "multi30k"] + args)
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    stdin((GERMAN[2] + "\n\n").encode())
    generate.main(["--task", "multi30k", "--models", str(trained), "--input", "-"])
    assert len(capsys.readouterr().out.split("\n")) == 3
    assert f"generate: error: --models {tmp_path / 'nowhere'}: not found (run the train stage first)\n" == fails(
        ["--models", str(tmp_path / "nowhere"), "--input", "-"])
    assert f"generate: error: --models {trained / 'model.pt'}: a file is there, where a directory is read\n" == fails(
        ["--models", str(trained / "model.pt"), "--input", "-"])
    (tmp_path / "half").mkdir()
    shutil.copy(trained / "model.pt", tmp_path / "half")
    assert "half/tokenizer/tokenizer.json: tokenizer not found (run the tokenize stage first)" in fails(
        ["--models", str(tmp_path / "half"), "--input", "-"])
    (tmp_path / "checkpoints").mkdir()  # neither there: the wrong directory, where running tokenize is no help
    assert fails(["--models", str(tmp_path / "checkpoints"), "--input", "-"]) == (
        f"generate: error: --models {tmp_path / 'checkpoints'}: holds neither model.pt nor tokenizer/: not a models "
        "directory as the pipeline writes it (models/<task>, holding both)\n")
    stdin(GERMAN[2].encode() + b"\nEin \xff Hund\n")
    assert "generate: error: stdin: line 2: not UTF-8 (byte 4)" in fails(["--models", str(trained), "--input", "-"])
    (tmp_path / "in.txt").write_text(GERMAN[2] + "\n")
    # The inputs are checked before the model loads: in the first, the models directory is not there either.
    assert f"generate: error: --input {tmp_path / 'in.de'}: not found\n" == fails(
        ["--models", str(tmp_path / "nowhere"), "--input", str(tmp_path / "in.de")])
    assert f"generate: error: --score {tmp_path}: a directory is there, where a file is read\n" == fails(
        ["--models", str(trained), "--input", str(tmp_path / "in.txt"), "--score", str(tmp_path)])
    assert f"--output {tmp_path}: a directory is there, where a file is written" in fails(
        ["--models", str(trained), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path)])
    assert f"--attention {tmp_path / 'in.txt'}: a file is there, where a directory is written" in fails(
        ["--models", str(trained), "--input", "-", "--attention", str(tmp_path / "in.txt")])
    # neither there yet: the figures' directory was made, then writing --output into it failed, the work lost
    for attention, how in [(tmp_path / "out", "is"), (tmp_path / "out" / "figures", "is in")]:
        assert fails(["--models", str(trained), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out"),
                      "--attention", str(attention)]) == (
            f"generate: error: --attention {attention}: {how} --output {tmp_path / 'out'}, the file the outputs go to "
            "(name another directory)\n")
    assert not (tmp_path / "out").exists()
    # the figures are drawn, then --output written: by one of their names in their directory, it replaced one
    (tmp_path / "link.txt").symlink_to(tmp_path / "figs" / "cross_attention_line1.png")
    for output in (tmp_path / "figs" / "attention.md", tmp_path / "link.txt"):
        assert fails(["--models", str(trained), "--input", str(tmp_path / "in.txt"), "--output", str(output),
                      "--attention", str(tmp_path / "figs")]) == (
            f"generate: error: --output {output}: in --attention {tmp_path / 'figs'}, by a name the figures take "
            "(attention.md, self_attention.png, *_attention_line*.png); the outputs would replace one (name another "
            "file)\n")
    assert not (tmp_path / "figs").exists()
    assert "generate: error: --alpha -1.0: must be >= 0; --prompt, --top-k: not for multi30k (translation)\n" == fails(
        ["--models", str(trained), "--input", "-", "--alpha", "-1", "--prompt", "Ein", "--top-k", "5"])
    assert "--n-best 4: must be in [1, --beam-size 3] (the beam holds that many outputs)" in fails(
        ["--models", str(trained), "--input", "-", "--beam-size", "3", "--n-best", "4"])
    assert "generate: error: --device 'gpu': not a device (auto, cpu, cuda, cuda:N, mps, ...)\n" == fails(
        ["--models", str(trained), "--input", str(tmp_path / "in.txt"), "--device", "gpu"])
    with pytest.raises(SystemExit) as exit_info:  # named as the option it came from (it said `tasks: unknown task`)
        generate.main(["--task", "multi30K", "--input", "-"])
    said = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --task: invalid choice: 'multi30K'" in said and "multi30k" in said
    # An alpha past the model's bound, named as the flag it came from, before the input is read (it said
    # `alpha 1000.0: ...`, and only once a line was read: at a terminal, once one had been typed)
    stdin(b"Ein \xff Hund\n")
    assert fails(["--models", str(trained), "--input", "-", "--alpha", "1000"]) == (
        "generate: error: --alpha 1000.0: the length penalty ((5 + length) / 6) ** alpha overflows at this model's "
        "longest output (64 tokens) for an alpha above 36.3 (GNMT's: 0.6 to 1)\n")


def test_generate_interrupted_is_one_line_and_writes_nothing(tmp_path, trained, capsys, monkeypatch):
    from lib.use import generate, translate_cli

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(translate_cli, "translate_lines", ctrl_c)  # Ctrl-C while translating
    files = tmp_path / "files"
    files.mkdir()
    (files / "in.txt").write_text(GERMAN[2] + "\n")
    with pytest.raises(SystemExit) as exit_info:
        generate.main(["--task", "multi30k", "--models", str(trained), "--input", str(files / "in.txt"),
                       "--output", str(files / "out.txt")])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "generate: interrupted; --output was not written\n"
    assert [p.name for p in files.iterdir()] == ["in.txt"]


def sentence_of(translator, n_tokens: int) -> str:
    """A German sentence that the translator reads as exactly ``n_tokens`` ids (its source <eos> included)."""
    from lib.data.tokenizer import encode_sources

    for words in range(1, n_tokens + 1):
        for end in ("", " ein"):  # "Hund" is read as two tokens here, "ein" as one
            text = " ".join(["Hund"] * words) + end
            if len(encode_sources(translator.tokenizers, [text])[0].ids) == n_tokens:
                return text
    raise AssertionError(f"no sentence of {n_tokens} tokens")


def test_a_translator_reads_input_as_the_data_was_prepared_up_to_its_max_len(trained):
    """A decomposed letter (a + combining diaeresis, as some editors write it) is read as the composed one the
    corpus was normalised to, not as <unk>; a source of exactly max_len tokens is translated, one token more is
    left without output, with a warning."""
    translator = load(trained)
    decomposed = unicodedata.normalize("NFD", GERMAN[0])
    assert decomposed != GERMAN[0]
    longest, too_long = sentence_of(translator, 64), sentence_of(translator, 65)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no <unk>, nothing too long
        assert translator.translate(decomposed, beam_size=3) == translator.translate(GERMAN[0], beam_size=3)
        assert translator.score(decomposed, ENGLISH[0]) == translator.score(GERMAN[0], ENGLISH[0])
        assert len(translator.n_best(longest, k=1)) == 1
    with pytest.warns(UserWarning, match=r"sentences\[0\]: 65 tokens, more than the model's max_len 64"):
        assert translator.n_best(too_long, k=1) == []


def test_a_path_starting_with_a_tilde_is_in_the_home_directory(tmp_path, trained, monkeypatch, capsys):
    """multi30k.fetch.source ~/raw is the home directory's raw files, not a hub data set of that name; a
    translation's --input, --models and --output read ~ as the home directory too, also where the shell leaves
    it (--input=~/in.txt)."""
    from lib.use import generate

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where a literal "~" directory would come
    prepare(tiny_params("~/raw"), tmp_path / "home_data")
    assert pd.read_parquet(tmp_path / "home_data" / "test.parquet")["tgt"].tolist() == ENGLISH[:6]
    (tmp_path / "in.txt").write_text(GERMAN[1] + "\n", encoding="utf-8")
    generate.main(["--task", "multi30k", "--models=~/models/multi30k", "--input=~/in.txt", "--output=~/out.txt"])
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == load(trained).translate(GERMAN[1]) + "\n"
    assert list((tmp_path / "cwd").iterdir()) == [] and capsys.readouterr().err == ""


def test_a_translator_loaded_from_python_gives_what_the_command_line_writes(tmp_path, trained, capsys):
    """lib.use.inference: one sentence in, one out; a list in, a list out, warnings naming the sentence at fault
    by its index; n-best lists and scores as the command line's table gives them; the attention itself."""
    from lib.use import generate
    from lib.data.tokenizer import encode_sources

    translator = load(trained)
    assert isinstance(translator, Translator)
    sentences = [GERMAN[0] + " ☃", "", " ".join(["Hund"] * 80), GERMAN[1]]
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    run = ["--task", "multi30k", "--models", str(trained), "--input", str(tmp_path / "in.txt"), "--beam-size", "3"]
    generate.main(run)
    written = capsys.readouterr().out.split("\n")[:4]
    with pytest.warns(UserWarning) as warned:
        assert translator.translate(sentences, beam_size=3) == written
    assert [str(w.message) for w in warned][0] == (
        "translate: sentences[0]: not in the model's vocabulary, read as <unk>: '☃'")
    assert re.fullmatch(r"translate: sentences\[2\]: \d+ tokens, more than the model's max_len 64; its output "
                        r"is left empty", str(warned[1].message)) and len(warned) == 2
    assert translator.translate(GERMAN[1], beam_size=3) == written[3]  # alone or in a list

    generate.main(run + ["--n-best", "3", "--alpha", "0.6"])
    table = pd.read_csv(io.StringIO(capsys.readouterr().out), sep="\t", keep_default_na=False)
    best = translator.n_best(GERMAN[1], k=3, beam_size=3)
    assert [o.text for o in best] == table[table["line"] == 4]["translation"].tolist()
    assert [round(o.score, 4) for o in best] == table[table["line"] == 4]["score"].tolist()
    assert all(isinstance(o, Output) and o.least_likely is None for o in best)
    with pytest.warns(UserWarning):
        assert [len(found) for found in translator.n_best(sentences, k=2, beam_size=3)] == [2, 0, 0, 2]

    scored = translator.score(GERMAN[1], best[0].text)  # beam search's own output, scored by teacher forcing
    assert (scored.text, scored.tokens, scored.eos) == (best[0].text, best[0].tokens, True)
    assert scored.log_prob == pytest.approx(best[0].log_prob, abs=1e-4)
    piece, log_prob = scored.least_likely
    assert scored.log_prob <= log_prob < 0 and piece in translator.tokenizers.target.get_vocab() | {"<eos>": 0}
    assert translator.score(["", GERMAN[0]], ["A dog.", ""])[0] is None

    maps = translator.attention(GERMAN[1])  # of the greedy output
    source = len(encode_sources(translator.tokenizers, [GERMAN[1]])[0].ids)
    greedy = translator.translate(GERMAN[1])
    tokens = len(translator.tokenizers.target.encode(greedy, add_special_tokens=False).ids) + 1  # with the eos
    shapes = {"encoder self-attention": (source, source), "decoder self-attention": (tokens, tokens),
              "cross-attention": (tokens, source)}
    cfg = translator.model.cfg
    for kind, (rows, cols) in shapes.items():
        attention = maps[kind]
        depth = cfg.encoder_layers if kind.startswith("encoder") else cfg.decoder_layers
        assert len(attention.layers) == depth and (len(attention.rows), len(attention.cols)) == (rows, cols)
        for weights in attention.layers:
            assert weights.shape == (cfg.n_heads, rows, cols)
            assert torch.allclose(weights.sum(-1), torch.ones(cfg.n_heads, rows), atol=1e-5)  # a row reads a whole
    assert maps["cross-attention"].rows[-1] == "<eos>" and maps["decoder self-attention"].cols[0] == "<bos>"
    assert torch.all(maps["decoder self-attention"].layers[0].triu(1) == 0)  # no step reads the future

    for call, message in [(lambda: translator.translate(GERMAN[0], beam_size=0),
                           r"beam_size 0: must be in \[1, 1000\]"),
                          (lambda: translator.n_best(GERMAN[0], k=4, beam_size=3),
                           r"k 4: must be in \[1, beam_size 3\]"),
                          (lambda: translator.score(GERMAN[:2], ["A dog."]), "1 outputs for 2 sources"),
                          (lambda: translator.translate(GERMAN[0], alpha=-1, max_extra_tokens=-1),
                           r"alpha -1: must be >= 0; max_extra_tokens -1: must be >= 0")]:
        with pytest.raises(ValueError, match=message):
            call()
