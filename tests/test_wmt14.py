"""The wmt14 task on a small sample in the hub's layout: fetched through the real datasets.load_dataset,
prepared a batch of rows at a time with its cleaning counted, and every stage run end to end."""

import json
import random
import shutil

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from lib.core.text import load_params
from lib.model import checkpoint
from lib.train import training
from lib.data.pairs import read_split
from lib.tasks.params import stage_config
from lib.data.token_store import MappedPairs
from lib.data.tokenizer import encode_pairs, load_tokenizers
from lib.tasks import translation, wmt14
from tests.conftest import (DVC, ROOT, TINY_PARAMS, code_not_in_deps, dvc_repo, fetch_and_prepare, offline_fetch_line,
                            sh, stages_run)

WORDS = {"the": "der", "dog": "Hund", "cat": "Katze", "runs": "läuft", "sleeps": "schläft", "house": "Haus",
         "in": "im", "garden": "Garten", "a": "ein", "big": "großer", "small": "kleiner", "red": "rote"}


def sentence_pair(rng: random.Random, words: int) -> dict:
    english = [rng.choice(list(WORDS)) for _ in range(words)]
    return {"en": " ".join(english) + ".", "de": " ".join(WORDS[w] for w in english) + "."}


def crawled(rng: random.Random) -> list[dict]:
    """Lines as web crawls hold them, each under 100 words, so that word-count cleaning keeps them, and over 256
    tokens: a long URL, a run of dots, unspaced Chinese."""
    path = "/".join(rng.choice(["a", "b", "c"]) for _ in range(200))
    chinese = ["".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(300)) for _ in range(2)]  # BPE learns none
    return [{"en": f"See https://example.com/{path} now.", "de": f"Siehe https://example.com/{path} jetzt."},
            {"en": "Wait" + "." * 300, "de": "Warte" + "." * 300},
            {"en": f"In Chinese: {chinese[0]}", "de": f"Auf Chinesisch: {chinese[1]}"}]


def write_sample(root, n_train: int = 300, seed: int = 0) -> dict:
    """A local folder in wmt/wmt14's layout, de-en/{train,validation,test}-00000-of-00001.parquet, with a
    ``translation`` column of {de, en} structs. The training split holds 3 pairs cleaning drops and 3 crawled
    lines too long for a model.max_len of 256; validation one crawled line, test one (its 31st sentence)."""
    rng = random.Random(seed)
    train = [sentence_pair(rng, rng.randint(2, 9)) for _ in range(n_train)]
    train += [{"en": " ", "de": "Leer."}, {"en": "word " * 120, "de": "Wort " * 120},
              {"en": "one two three four five six seven", "de": "eins"}] + crawled(rng)
    splits = {"train": train,
              "validation": [sentence_pair(rng, rng.randint(2, 9)) for _ in range(40)] + crawled(rng)[:1],
              "test": [sentence_pair(rng, rng.randint(2, 9)) for _ in range(30)] + crawled(rng)[:1]}
    (root / "de-en").mkdir(parents=True)
    for name, rows in splits.items():
        pq.write_table(pa.table({"translation": rows}), root / "de-en" / f"{name}-00000-of-00001.parquet")
    return splits


WMT_TINY = {
    "fetch": {"source": "", "config": "de-en"},
    "prepare": {"src_lang": "en", "tgt_lang": "de", "max_words": 100, "max_ratio": 3.0},
    "tokenize": {"kind": "bpe", "vocab_size": 200, "min_frequency": 1, "joint": True},
    "train": {"seed": 0, "device": "cpu", "epochs": 2, "max_tokens": 512, "lr_factor": 1.0, "warmup": 20,
              "label_smoothing": 0.1, "clip_norm": 1.0, "checkpoint_every": 50,
              "model": {"d_model": 32, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 64,
                        "dropout": 0.1, "norm_first": False, "tie_embeddings": True, "fused_qkv": True,
                        "max_len": 64}},
    "evaluate": {"max_tokens": 1024, "max_extra_tokens": 5, "n_samples": 5, "beam_size": 2, "alpha": 0.6},
    "report": {"n_attention_examples": 1},
}


def test_the_sample_loads_through_datasets_and_prepare_counts_what_cleaning_dropped(tmp_path):
    splits = write_sample(tmp_path / "hub")
    cfg = {**WMT_TINY, "fetch": {"source": str(tmp_path / "hub"), "config": "de-en"}}
    params = {**TINY_PARAMS, "tasks": ["wmt14"], "wmt14": cfg}
    fetch_and_prepare("wmt14", stage_config(params, "wmt14", "fetch"), stage_config(params, "wmt14", "prepare"),
                      tmp_path / "data")
    cleaning = json.loads((tmp_path / "data" / "cleaning.json").read_text())
    assert cleaning["train"] == {"read": 306, "kept": 303, "dropped": {"empty": 1, "too_long": 1, "ratio": 1}}
    assert cleaning["valid"] == {"read": 41, "kept": 41, "dropped": {"empty": 0, "too_long": 0, "ratio": 0}}
    train, test = (pd.read_parquet(tmp_path / "data" / f"{split}.parquet") for split in ("train", "test"))
    kept = splits["train"][:300] + splits["train"][303:]  # the crawled lines pass cleaning by words
    assert train["src"].tolist() == [row["en"] for row in kept]  # English -> German
    assert test["tgt"].tolist() == [row["de"] for row in splits["test"]]
    texts = wmt14.WMT14().tokenizer_texts(None, tmp_path / "data", "both")  # an iterator: BPE learns a batch at a time
    assert list(texts) == train["src"].tolist() + train["tgt"].tolist()  # one batch here


def test_a_hub_revision_with_other_row_counts_is_named():
    wmt14.check_rows("wmt/wmt14@abc", {"train": 4_508_785, "validation": 3_000, "test": 3_003})
    with pytest.raises(ValueError, match=r"^wmt14\.fetch\.source: wmt/wmt14@abc holds train 4,508,700 \(expected "
                       r"4,508,785\), test 0 \(expected 3,003\) rows"):
        wmt14.check_rows("wmt/wmt14@abc", {"train": 4_508_700, "validation": 3_000})


@pytest.mark.slow  # a stage as its own process
def test_an_unreachable_source_says_how_to_work_offline(tmp_path):
    """Offline (HF_HUB_OFFLINE, as without internet): one line naming the source and the way to a local copy."""
    line = offline_fetch_line("wmt14", {**TINY_PARAMS, "tasks": ["wmt14"], "wmt14": {
        **WMT_TINY, "fetch": {"source": "someone/wmt14@0123abc", "config": "de-en"}}}, tmp_path)
    assert line.startswith("fetch@wmt14: error: wmt14.fetch.source: could not load 'someone/wmt14@0123abc' as a "
                           "Hugging Face data set (")
    assert line.endswith("dvc exp run -S wmt14.fetch.source=/path/to/copy")
    assert not (tmp_path / "sources").exists()


def shipped_with_a_tiny_model(source) -> dict:
    """params.yaml's wmt14 section as shipped, but for a tiny model (max_len kept), 3 steps and a checkpoint
    averaged at each: the paper's recipe, run in seconds."""
    shipped = load_params(ROOT / "params.yaml")["wmt14"]
    train = shipped["train"]
    return {**shipped, "fetch": {**shipped["fetch"], "source": str(source)},
            "train": {**train, "max_steps": 3, "average_every": 1, "model": {
                **train["model"], "d_model": 32, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 64}}}


@pytest.mark.slow
def test_dvc_exp_run_takes_crawled_lines_through_every_stage_with_the_shipped_params(tmp_path):
    """`dvc exp run -S 'tasks=[wmt14]'` in a temporary repo, the source a local folder in the hub's layout with
    crawled lines: training skips and counts those over model.max_len, every test sentence is scored (the long
    one decoded from its first 256 tokens), and the report says what was left out."""
    write_sample(tmp_path / "hub")
    params = {**TINY_PARAMS, "wmt14": shipped_with_a_tiny_model(tmp_path / "hub")}
    repo, env, loaded = dvc_repo(tmp_path, params)
    ran = sh(DVC, "exp", "run", "-S", "tasks=[wmt14]", cwd=repo, env=env)
    assert stages_run(ran) == {"index"} | {f"{stage}@wmt14" for stage in ("fetch", "prepare", "tokenize", "train",
                                                                           "evaluate", "report")}
    assert code_not_in_deps(loaded, repo) == {}
    metrics = json.loads((repo / "reports" / "wmt14" / "metrics.json").read_text())
    assert metrics["n_test"] == 31 and metrics["n_test_cut"] == 1
    assert "bleu" in metrics["greedy"] and "tokenized_bleu" in metrics["beam4"]
    assert metrics["greedy"]["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    samples = pd.read_json(repo / "reports" / "wmt14" / "samples.jsonl", lines=True)
    assert len(samples) == 31 and samples["source"].iloc[-1].startswith("See https://example.com/")
    model = checkpoint.load(repo / "models" / "wmt14" / "model.pt")
    assert model["skipped_too_long"] == {"train": 3, "valid": 1}
    assert model["averaged_checkpoints"] == 3  # train.average always: the mean of steps 1, 2 and 3
    report = (repo / "reports" / "wmt14" / "report.md").read_text()
    assert "## Data left out" in report and "- train skipped 3 train pairs longer than model.max_len" in report
    assert "prepare dropped 3 of 306 train pairs (1 empty, 1 too_long, 1 ratio;" in report
    assert "- 1 of 31 test sources are longer than model.max_len" in report
    assert "greedy.bleu" in sh(DVC, "metrics", "show", cwd=repo, env=env)
    assert "wmt14/card.html" in (repo / "reports" / "index.html").read_text()

    # The tokenize stage wrote the splits' ids once; they are the in-memory path's, and train read them
    data, tokenizer = repo / "data" / "wmt14", repo / "models" / "wmt14" / "tokenizer"
    tokenizers = load_tokenizers(tokenizer)
    for split in ("train", "valid"):
        mapped, encoded = MappedPairs(tokenizer, split), encode_pairs(tokenizers, read_split(data, split))
        assert list(mapped.src) == encoded.src and list(mapped.tgt) == encoded.tgt, split
    shutil.copytree(tokenizer, tmp_path / "in_memory")
    for stored in (tmp_path / "in_memory").glob("*.tokens.json"):
        stored.unlink()  # without its counts the store is not there: train encodes the splits itself
    cfg = stage_config(yaml.safe_load((repo / "params.yaml").read_text()), "wmt14", "train")  # tasks: [wmt14]
    training.run("wmt14", cfg, data, tmp_path / "in_memory", tmp_path / "m.pt", tmp_path / "ck", tmp_path / "live")
    mapped_model, memory_model = (checkpoint.load(path)["model"] for path in (repo / "models" / "wmt14" / "model.pt",
                                                                              tmp_path / "m.pt"))
    assert all(torch.equal(mapped_model[name], memory_model[name]) for name in memory_model)


# Sentences with what separates tokenizers, and what Moses' Perl scripts of the paper's time (mosesdecoder at
# b8de7c352, 2017-05-02: replace-unicode-punctuation.perl -l de | tokenizer.perl -l de | perl -ple ATAT) made of
# them; multi-bleu.perl scored HYPOTHESES against them 85.13 (benchmarks/wmt14/paper_bleu.py, docs/results.md).
REFERENCES = ["„Das ist z.B. 1-2 Mal so gut“, sagte Dr. Müller.",
              'Er sagte: "Es kostet 3,50 € & mehr" [siehe S. 12].',
              "Der Ost-West-Konflikt endete am 3. Oktober 1990 ... oder?",
              "Die 25-jährige Frau schreibt eine E-Mail an www.example.de/a-b?x=1 <3",
              "'Fenster' ist ein Wort, d.h. 10.000 km/h sind 2.5%."]
PERL_TOKENS = ["„ Das ist z.B. 1 ##AT##-##AT## 2 Mal so gut &quot; , sagte Dr. Müller .",
               "Er sagte : &quot; Es kostet 3,50 € &amp; mehr &quot; &#91; siehe S. 12 &#93; .",
               "Der Ost ##AT##-##AT## West ##AT##-##AT## Konflikt endete am 3. Oktober 1990 ... oder ?",
               "Die 25 ##AT##-##AT## jährige Frau schreibt eine E ##AT##-##AT## Mail an www.example.de / a "
               "##AT##-##AT## b ? x = 1 &lt; 3",
               "&apos; Fenster &apos; ist ein Wort , d.h. 10.000 km / h sind 2.5 % ."]
HYPOTHESES = ["„Das ist z.B. 1-2 Mal besser“, sagte Dr. Müller.",
              'Er sagte: "Es kostet 3,50 € und mehr" [siehe S. 12].',
              "Der Ost-West-Streit endete am 3. Oktober 1990 ... oder?",
              REFERENCES[3],
              "'Fenster' ist ein Wort, also 10.000 km/h sind 2.5%."]


def test_tokenized_bleu_is_the_papers_perl_pipeline():
    """The paper's BLEU: Moses' German tokens (quotes split off and escaped, z.B. and Dr. kept, numbers kept
    whole), every hyphen inside a word its own ##AT##-##AT## token, and multi-bleu.perl's corpus BLEU."""
    assert [translation.paper_tokens(text) for text in REFERENCES] == PERL_TOKENS
    scores = wmt14.WMT14().score(HYPOTHESES, REFERENCES)
    assert round(scores["tokenized_bleu"], 2) == 85.13
    assert scores["tokenized_bleu"] > scores["bleu"]  # compounds split: more matched tokens
    assert wmt14.WMT14().score(REFERENCES, REFERENCES)["tokenized_bleu"] == pytest.approx(100.0)
    assert "##AT##" in scores["tokenized_bleu_signature"]
