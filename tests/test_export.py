"""lib.use.export: a trained model as a folder to take away (model.safetensors, config.json, tokenizer/, a model
card), loaded by the toolkit with no torch pickle, decoding as model.pt does."""

import json
import shutil
import subprocess
import sys

import pytest

from lib.data.pairs import read_split
from lib.use import export, inference
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
    assert card.startswith("---\nlicense: mit\npipeline_tag: translation\n")
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
