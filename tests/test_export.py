"""lib.use.export: a trained model as a folder to take away (model.safetensors, config.json, tokenizer/, a model
card), loaded by the toolkit with no torch pickle, decoding as model.pt does."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from lib.data.pairs import read_split
from lib.data.tokenizer import special_ids
from lib.use import export, inference, to_ctranslate2
from tests.conftest import ROOT
from tests.test_stages import built  # noqa: F401 (the tiny cumsum pipeline, a fixture)

# A fresh process in which reading a torch pickle fails: the folder must load without one
WITHOUT_PICKLE = """
import json, sys, torch
def refused(*args, **kwargs):
    raise AssertionError("torch.load was called")
torch.load = refused
from lib.use import inference
print(json.dumps(inference.load(sys.argv[1], task="cumsum").translate(json.loads(sys.argv[2]), beam_size=2)))
"""


@pytest.fixture
def models(built, tmp_path):
    directory = tmp_path / "models"
    shutil.copytree(built["tokenizer"], directory / "tokenizer")
    shutil.copyfile(built["model"], directory / "model.pt")
    return directory


def test_an_exported_model_translates_as_model_pt_does_without_a_pickle(built, models, tmp_path, capsys):
    out = tmp_path / "exported"
    export.main(["--task", "cumsum", "--models", str(models), "--metrics", str(built["metrics"]), "--out", str(out)])
    assert capsys.readouterr().out == f"exported cumsum to {out}\n"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "tokenizer"]
    config = json.loads((out / "config.json").read_text())
    assert config["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3} and config["kind"] == "seq2seq"
    card = (out / "README.md").read_text()
    metrics = json.loads(built["metrics"].read_text())
    assert card.startswith("---\nlicense: mit\nlibrary_name: pytorch\npipeline_tag: translation\n")
    assert f"| greedy.exact_match | {metrics['greedy']['exact_match']:.4f} |" in card and "## Intended use" in card
    sources = read_split(built["data"], "test")["src"].tolist()[:40]
    expected = inference.load(models).translate(sources, beam_size=2)
    done = subprocess.run([sys.executable, "-c", WITHOUT_PICKLE, str(out), json.dumps(sources)], cwd=ROOT,
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected


def test_a_damaged_export_or_a_missing_model_is_named(built, models, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        export.main(["--task", "cumsum", "--models", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2 and "export: error: " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    out = tmp_path / "exported"
    export.main(["--task", "cumsum", "--models", str(models), "--out", str(out)])
    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match=r"model\.safetensors: weights that do not fit config\.json"):
        inference.load(out)


def test_cumsum_exported_to_ctranslate2_decodes_as_ours(built, models, tmp_path, capsys):
    """CTranslate2, on the exported weights, finds our greedy outputs for the whole test set, and gives every
    reference token the log-probability we give it (teacher forcing), within 1e-4."""
    import ctranslate2

    from lib.data.tokenizer import encode_pairs
    from lib.evaluate.decode import score_outputs, translate
    from lib.model import checkpoint

    out = tmp_path / "ct2"
    export.main(["--task", "cumsum", "--models", str(models), "--out", str(out), "--format", "ctranslate2"])
    assert capsys.readouterr().out == f"exported cumsum to {out}\n"
    model, tokenizers, _ = checkpoint.load_directory(models)
    ids = special_ids(tokenizers)
    test = encode_pairs(tokenizers, read_split(built["data"], "test"))
    ours = translate(model, test.src, ids, 4096, 4)
    options = json.loads((out / to_ctranslate2.OPTIONS_FILE).read_text())
    # CTranslate2 sets OpenMP's thread count for the whole process: torch's, so that later tests here train alike
    translator = ctranslate2.Translator(str(out), device="cpu", inter_threads=1, intra_threads=torch.get_num_threads())
    source_tokens = [[tokenizers.source.id_to_token(i) for i in s] for s in test.src]
    theirs = to_ctranslate2.translate(translator, source_tokens, options)
    assert [[tokenizers.target.token_to_id(t) for t in tokens] for tokens in theirs] == ours
    reference = score_outputs(model, test.src, test.tgt, ids, 4096)
    scored = translator.score_batch(source_tokens, [[tokenizers.target.id_to_token(i) for i in t] for t in test.tgt])
    difference = max(abs(a - b) for h, s in zip(reference, scored) for a, b in zip(h.token_log_probs, s.log_probs))
    assert [len(s.log_probs) for s in scored] == [len(h.token_log_probs) for h in reference]  # the eos's too
    assert difference < 1e-4


@pytest.mark.parametrize("override, said", [
    ({"positional": "rope"}, "model.positional rope"), ({"n_kv_heads": 1, "n_heads": 2}, "model.n_kv_heads 1"),
    ({"norm": "rmsnorm"}, "model.norm rmsnorm"), ({"activation": "swiglu"}, "model.activation swiglu"),
    ({"d_head": 4}, "model.d_head 4")])
def test_what_ctranslate2_cannot_express_is_refused_by_name(override, said):
    from tests.conftest import model_config

    assert any(said in reason for reason in to_ctranslate2.unsupported("seq2seq", model_config(**override), 0.0))
    assert any("evaluate.alpha 0.6" in r and "--alpha 0" in r
               for r in to_ctranslate2.unsupported("seq2seq", model_config(), 0.6))
    assert to_ctranslate2.unsupported("seq2seq", model_config(), 0.0) == []


def test_an_alpha_ctranslate2_cannot_express_stops_the_export_before_writing(models, tmp_path, capsys):
    (models / "generation.json").write_text(json.dumps({"beam_size": 4, "alpha": 0.6, "max_extra_tokens": 4}))
    with pytest.raises(SystemExit) as stop:
        export.main(["--task", "cumsum", "--models", str(models), "--out", str(tmp_path / "ct2"),
                     "--format", "ctranslate2"])
    said = capsys.readouterr().err
    assert stop.value.code == 2 and "evaluate.alpha 0.6: CTranslate2 has no GNMT length penalty" in said
    assert not (tmp_path / "ct2").exists()
    export.main(["--task", "cumsum", "--models", str(models), "--out", str(tmp_path / "ct2"), "--format",
                 "ctranslate2", "--alpha", "0"])
    options = json.loads((tmp_path / "ct2" / to_ctranslate2.OPTIONS_FILE).read_text())
    assert options["translate_batch"]["beam_size"] == 4 and options["translate_batch"]["length_penalty"] == 0.0


@pytest.mark.parametrize("format_", ["huggingface", "ctranslate2"])
def test_an_export_over_a_users_folder_is_refused_and_loses_nothing(models, tmp_path, capsys, format_):
    """An export replaces its folder whole: pointed at one holding a user's file, it refuses, naming the folder
    and the file, and the file stays. Over its own earlier export it writes again, as over a new folder."""
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "thesis.txt").write_text("three years of work")
    argv = ["--task", "cumsum", "--models", str(models), "--out", str(out), "--format", format_]
    with pytest.raises(SystemExit) as stop:
        export.main(argv)
    said = capsys.readouterr().err
    assert stop.value.code == 2, said
    assert f"export: error: {out}: holds thesis.txt, which the " in said and "would be lost" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "thesis"]  # nothing aside, nothing half-written
    assert [p.name for p in out.iterdir()] == ["thesis.txt"]
    assert (out / "thesis.txt").read_text() == "three years of work"

    again = tmp_path / "again"
    export.main([*argv[:-3], str(again), "--format", format_])
    first = sorted(p.name for p in again.iterdir())
    export.main([*argv[:-3], str(again), "--format", format_])
    assert sorted(p.name for p in again.iterdir()) == first
