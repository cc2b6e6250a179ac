"""train.init_from: a run that starts from trained weights (lib.model.initial), refused with what differs named."""

import dataclasses
import json
import shutil

import pytest
import torch

from lib.core.config import ConfigError, ModelConfig, from_dict
from lib.core.sections import TrainConfig
from lib.data.tokenizer import load_tokenizers
from lib.model import checkpoint
from lib.model.initial import start_from
from lib.use import export
from tests.conftest import TINY_PARAMS
from tests.test_stages import built  # noqa: F401 (the tiny cumsum pipeline, a fixture)
from transformer.model import build_model


@pytest.fixture
def start(built, tmp_path, monkeypatch):
    """The trained tiny cumsum model copied under init/, as a user copies models/<task>; the cwd is its repo."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "init" / "cumsum"
    shutil.copytree(built["tokenizer"], folder / "tokenizer")
    shutil.copyfile(built["model"], folder / "model.pt")
    trained = checkpoint.load(built["model"])
    vocab = {key: trained[key] for key in ("src_vocab_size", "tgt_vocab_size", "joint_vocab")}
    return trained, vocab, load_tokenizers(built["tokenizer"])


def fresh(trained: dict, vocab: dict, **changes):
    cfg = dataclasses.replace(from_dict(ModelConfig, trained["model_config"], "model_config"), **changes)
    return build_model(cfg, "seq2seq", **vocab)


def test_a_run_starts_from_the_trained_weights_of_a_copy_or_an_export(start, built, tmp_path):
    trained, vocab, tokenizers = start
    for path in ("init/cumsum", "init/cumsum/model.pt"):
        model = fresh(trained, vocab, dropout=0.3)  # regularisation may change when fine-tuning
        start_from(model, path, "seq2seq", vocab, tokenizers)
        assert all(torch.equal(value, trained["model"][key]) for key, value in model.state_dict().items())
    export.export("cumsum", tmp_path / "init" / "cumsum", None, tmp_path / "init" / "exported")
    model = fresh(trained, vocab)
    start_from(model, "init/exported", "seq2seq", vocab, tokenizers)
    assert all(torch.equal(value, trained["model"][key]) for key, value in model.state_dict().items())


def test_a_start_of_other_params_family_or_tokenizer_is_refused_naming_what_differs(start, tmp_path):
    trained, vocab, tokenizers = start
    d_model = trained["model_config"]["d_model"]
    with pytest.raises(ConfigError, match=rf"train.init_from: init/cumsum is not a start for this run: model.d_model "
                                          rf"{d_model} \(train.model.d_model is {2 * d_model}\)"):
        start_from(fresh(trained, vocab, d_model=2 * d_model), "init/cumsum", "seq2seq", vocab, tokenizers)
    with pytest.raises(ConfigError, match=r"it is a seq2seq model, and this task trains a lm model"):
        start_from(fresh(trained, vocab), "init/cumsum", "lm", vocab, tokenizers)
    with pytest.raises(ConfigError, match=r"tgt_vocab_size \d+ \(this run's tokenizer: 5\)"):
        start_from(fresh(trained, vocab), "init/cumsum", "seq2seq", {**vocab, "tgt_vocab_size": 5}, tokenizers)
    path = tmp_path / "init" / "cumsum" / "tokenizer" / "tokenizer.json"
    saved = json.loads(path.read_text())
    vocabulary = saved["model"]["vocab"]
    first, second = list(vocabulary)[4:6]  # two tokens after the specials trade ids
    vocabulary[first], vocabulary[second] = vocabulary[second], vocabulary[first]
    path.write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=r"its source tokenizer \(init/cumsum/tokenizer\) gives 2 of \d+ tokens"):
        start_from(fresh(trained, vocab), "init/cumsum", "seq2seq", vocab, tokenizers)
    with pytest.raises(FileNotFoundError, match=r"train.init_from: init/none holds no model.pt"):
        start_from(fresh(trained, vocab), "init/none", "seq2seq", vocab, tokenizers)


def test_init_from_must_be_under_the_folder_dvc_tracks():
    section = TINY_PARAMS["cumsum"]["train"]
    for bad in ("models/cumsum", "/abs/init/x", "init/../models/cumsum"):
        with pytest.raises(ConfigError, match=r"init_from: .* is not under init/"):
            from_dict(TrainConfig, {**section, "init_from": bad}, "train")
    assert from_dict(TrainConfig, {**section, "init_from": "init/cumsum"}, "train").init_from == "init/cumsum"
