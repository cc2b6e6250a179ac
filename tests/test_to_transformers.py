"""lib.use.export --format transformers: a folder that `transformers`' auto classes load in a fresh process, a
MarianMT model for a translation model and a GPT-2 model for the LM, computing what ours computes."""

import json
import subprocess
import sys

import pytest
import torch

from lib.core.config import ModelConfig, from_dict
from lib.core.text import load_params
from lib.data.pairs import SpecialIds
from lib.data.pairs import read_split
from lib.data.tokenizer import encode_pairs, special_ids
from lib.evaluate.decode import translate
from lib.model import checkpoint
from lib.use import export, to_transformers
from lib.use.families import USES
from tests.conftest import ROOT, model_config
from tests.test_export import models  # noqa: F401 (the trained tiny cumsum model as a models directory)
from tests.test_lm import lm_built, models_dir  # noqa: F401 (the trained tiny LM, a fixture)
from tests.test_stages import built  # noqa: F401 (the tiny cumsum pipeline, a fixture)
from transformer.masks import padding_mask, target_mask
from transformer.model import build_model

# A fresh process that knows nothing of the toolkit: transformers' auto classes on the folder alone. It writes
# the teacher-forced logits and the greedy outputs, which the tests hold against ours.
WITH_TRANSFORMERS = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
folder, request, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
found = {}
if "input_ids" not in request:
    tokenizer = AutoTokenizer.from_pretrained(folder)
with torch.no_grad():
    if "input_ids" in request:  # a model without its tokenizer: ids in, logits out
        model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        source = torch.tensor(request["input_ids"])
        found["logits"] = model(input_ids=source, attention_mask=(source != model.config.pad_token_id).long(),
                                decoder_input_ids=torch.tensor(request["targets"])).logits
    elif "sources" in request:
        model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        batch = tokenizer(request["sources"], return_tensors="pt", padding=True)
        lengths = batch.attention_mask.sum(1).tolist()
        found["source_ids"] = [row[:n] for row, n in zip(batch.input_ids.tolist(), lengths)]
        found["logits"] = model(**batch, decoder_input_ids=torch.tensor(request["targets"])).logits
        found["greedy"] = []
        for source, limit in zip(request["sources"], request["limits"]):
            one = tokenizer([source], return_tensors="pt")
            found["greedy"].append(model.generate(**one, max_new_tokens=limit)[0].tolist())
    else:
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        ids = tokenizer(request["prompt"], return_tensors="pt").input_ids
        found["prompt_ids"] = ids[0].tolist()
        found["logits"] = model(ids).logits
        found["greedy"] = model.generate(ids, do_sample=False, max_new_tokens=request["new"])[0].tolist()
torch.save(found, out)
"""


def with_transformers(folder, request: dict, tmp_path) -> dict:
    out = tmp_path / "found.pt"
    done = subprocess.run([sys.executable, "-c", WITH_TRANSFORMERS, str(folder), json.dumps(request), str(out)],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


def test_cumsum_loads_in_transformers_as_a_marian_model_with_our_logits_and_outputs(built, models, tmp_path, capsys):
    """Teacher-forced logits within 1e-4 of ours, and our greedy outputs on the whole test set, each allowed its
    source's length + max_extra_tokens tokens as ours is."""
    out = tmp_path / "exported"
    export.main(["--task", "cumsum", "--models", str(models), "--metrics", str(built["metrics"]), "--out", str(out),
                 "--format", "transformers"])
    assert capsys.readouterr().out == f"exported cumsum to {out}\n"
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "README.md"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "model-index:" in card and "AutoModelForSeq2SeqLM" in card
    model, tokenizers, _ = checkpoint.load_directory(models)
    ids = special_ids(tokenizers)
    frame = read_split(built["data"], "test")
    test = encode_pairs(tokenizers, frame)
    ours = translate(model, test.src, ids, 4096, 4)
    longest = max(map(len, test.tgt)) + 1
    targets = [[ids.bos] + t + [ids.pad] * (longest - 1 - len(t)) for t in test.tgt]
    limits = [min(len(s) + 4, model.cfg.max_len - 1) for s in test.src]
    found = with_transformers(out, {"sources": frame["src"].tolist(), "targets": targets, "limits": limits}, tmp_path)
    assert found["source_ids"] == test.src  # the source side's <eos> came along in tokenizer.json
    with torch.no_grad():
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in test.src], True, ids.pad)
        tgt = torch.tensor(targets)
        logits = model(src, tgt, padding_mask(src, ids.pad), target_mask(tgt, ids.pad))
    real = tgt != ids.pad
    assert (found["logits"][real] - logits[real]).abs().max() < 1e-4
    theirs = [[t for t in row[1:]] for row in found["greedy"]]  # after <bos>, up to <eos>
    assert [row[:row.index(ids.eos)] if ids.eos in row else row for row in theirs] == ours


def test_multi30ks_default_model_gives_the_same_logits_in_transformers(tmp_path):
    """params.yaml's multi30k model (d_model 256, 3 + 3 layers, 8 heads, tied embeddings), at its vocabulary
    size, random weights; docs/results.md has the trained one's 1,000 test sentences."""
    cfg = from_dict(ModelConfig, load_params(ROOT / "params.yaml")["multi30k"]["train"]["model"], "multi30k")
    torch.manual_seed(0)
    model = build_model(cfg, "seq2seq", 8000, 8000, True).eval()
    ids = SpecialIds(pad=0, bos=1, eos=2, unk=3)
    to_transformers.marian(model, ids).save_pretrained(tmp_path / "exported")
    src = torch.randint(4, 8000, (3, 17))
    src[1, 12:] = ids.pad
    tgt = torch.cat([torch.full((3, 1), ids.bos), torch.randint(4, 8000, (3, 15))], dim=1)
    found = with_transformers(tmp_path / "exported", {"input_ids": src.tolist(), "targets": tgt.tolist()}, tmp_path)
    with torch.no_grad():
        logits = model(src, tgt, padding_mask(src, ids.pad), target_mask(tgt, ids.pad))
    assert (found["logits"] - logits).abs().max() < 1e-4


def test_the_lm_loads_in_transformers_as_gpt2_with_our_logits_and_greedy_continuation(lm_built, tmp_path, capsys):
    from lib.use import inference

    models = models_dir(lm_built, tmp_path)
    out = tmp_path / "exported"
    export.main(["--task", "shakespeare", "--models", str(models), "--metrics", str(lm_built["metrics"]),
                 "--out", str(out), "--format", "transformers"])
    lm = inference.load(models)
    prompt = "ROMEO:"
    new = lm.model.cfg.max_len - len(prompt)  # GPT-2 sees at most n_positions tokens: no sliding window
    found = with_transformers(out, {"prompt": prompt, "new": new}, tmp_path)
    ids = lm.tokenizers.target.encode(prompt, add_special_tokens=False).ids
    assert found["prompt_ids"] == ids
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids]))
    assert (found["logits"] - logits).abs().max() < 1e-4
    greedy = lm.sampled_ids(list(ids), max_new_tokens=new, top_k=1, seed=0)
    assert found["greedy"] == ids + list(greedy)
    assert "AutoModelForCausalLM" in (out / "README.md").read_text()


REFUSED = [({"positional": "rope"}, "model.positional rope"), ({"positional": "alibi"}, "model.positional alibi"),
           ({"n_kv_heads": 1, "n_heads": 2}, "model.n_kv_heads 1"), ({"norm": "rmsnorm"}, "model.norm rmsnorm"),
           ({"activation": "swiglu"}, "model.activation swiglu"), ({"d_head": 4}, "model.d_head 4")]


@pytest.mark.parametrize("kind, override, said", [
    *(("seq2seq", *case) for case in REFUSED), *(("lm", *case) for case in REFUSED),
    ("seq2seq", {"norm_first": True}, "model.norm_first true"),
    ("seq2seq", {"positional": "learned"}, "model.positional learned"),
    ("lm", {"norm_first": False}, "model.norm_first false"), ("lm", {"bias": True}, "model.bias true")])
def test_what_marian_or_gpt2_cannot_express_is_refused_by_name(kind, override, said):
    family, base = USES[kind], {"bias": False, "norm_first": True} if kind == "lm" else {}
    assert any(said in reason for reason in to_transformers.unsupported(family, model_config(**{**base, **override}),
                                                                        joint_vocab=True))
    assert to_transformers.unsupported(family, model_config(**base), joint_vocab=True) == []
    assert any("tokenize.joint false" in r for r in to_transformers.unsupported(USES["seq2seq"], model_config(), False))


def test_a_model_transformers_cannot_express_stops_the_export_before_writing(built, models, tmp_path, capsys):
    state = torch.load(models / "model.pt", weights_only=False)
    state["model_config"]["positional"] = "learned"
    cfg = from_dict(ModelConfig, state["model_config"], "model_config")
    state["model"] = build_model(cfg, "seq2seq", state["src_vocab_size"], state["tgt_vocab_size"], True).state_dict()
    torch.save(state, models / "model.pt")
    with pytest.raises(SystemExit) as stop:
        export.main(["--task", "cumsum", "--models", str(models), "--out", str(tmp_path / "hf"),
                     "--format", "transformers"])
    assert stop.value.code == 2 and "model.positional learned: Marian takes sinusoidal" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_the_card_names_the_library_languages_data_and_test_metrics_with_their_signatures():
    metrics = {"n_test": 1000, "perplexity": 5.08, "greedy": {"bleu": 39.653, "bleu_signature": "nrefs:1|tok:13a",
                                                              "chrf": 59.46, "seconds": 12.0},
               "beam5": {"bleu": 41.56, "bleu_signature": "nrefs:1|tok:13a"}}
    block = export.metadata("multi30k", metrics, "transformers")
    assert block["library_name"] == "transformers" and block["pipeline_tag"] == "translation"
    assert block["language"] == ["de", "en"] and block["datasets"] == ["bentrevett/multi30k"]
    (result,) = block["model-index"][0]["results"]
    assert result["dataset"] == {"name": "multi30k", "type": "bentrevett/multi30k", "split": "test"}
    assert result["metrics"] == [
        {"type": "bleu", "name": "bleu (greedy, test)", "value": 39.653, "args": {"signature": "nrefs:1|tok:13a"}},
        {"type": "chrf", "name": "chrf (greedy, test)", "value": 59.46},
        {"type": "bleu", "name": "bleu (beam5, test)", "value": 41.56, "args": {"signature": "nrefs:1|tok:13a"}},
        {"type": "perplexity", "name": "perplexity (test)", "value": 5.08}]
    assert "model-index" not in export.metadata("cumsum", {}, "pytorch")  # nothing measured, nothing claimed
