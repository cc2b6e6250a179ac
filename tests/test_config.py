"""params.yaml validation: a bad key fails before any work, naming the key."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lib.core.config import ConfigError
from lib.core.text import load_params
from lib.tasks.params import check_stages_after, check_tasks, stage_config
from tests.conftest import ROOT, run_stage


@pytest.mark.parametrize(
    "stage, edit, message",
    [
        ("train", lambda p: p["train"].update(epocs=3), r"cumsum\.train\.epocs: unknown key"),
        ("train", lambda p: p["train"].pop("warmup"), r"cumsum\.train\.warmup: missing key"),
        ("train", lambda p: p["train"].update(epochs="many"), r"cumsum\.train\.epochs: expected int"),
        ("train", lambda p: p["train"].update(epochs=True), r"cumsum\.train\.epochs: expected int"),
        ("train", lambda p: p["train"]["model"].update(n_heads=3),
         r"cumsum\.train\.model\.d_model: 16 is not divisible"),
        ("train", lambda p: p["train"]["model"].update(dropout=1.0),
         r"cumsum\.train\.model\.dropout: must be in \[0, 1\)"),
        ("train", lambda p: p["train"].update(max_tokens=0), r"cumsum\.train\.max_tokens: must be > 0"),
        ("train", lambda p: p["train"]["model"].update(rope_base=1), r"cumsum\.train\.model\.rope_base: must be > 1"),
        ("train", lambda p: p["train"]["model"].update(n_kv_heads=3),
         r"cumsum\.train\.model\.n_kv_heads: 3 does not divide n_heads 2"),
        ("train", lambda p: p["train"]["model"].update(norm="batchnorm"),
         r"cumsum\.train\.model\.norm: 'batchnorm' is not one of layernorm, rmsnorm"),
        ("train", lambda p: p["train"]["model"].update(activation="tanh"),
         r"cumsum\.train\.model\.activation: 'tanh' is not one of relu, gelu, swiglu"),
        ("train", lambda p: p["train"].update(device="tpu"), r"cumsum\.train\.device: 'tpu' is not one of"),
        ("train", lambda p: p["train"].update(peak_tflops="auto"),
         r"cumsum\.train\.peak_tflops: 'auto' is neither a number >= 0 nor 'measure'"),
        ("train", lambda p: p["train"].update(peak_tflops=-1), r"cumsum\.train\.peak_tflops: -1.0 is neither"),
        ("train", lambda p: p["train"].update(peak_tflops=[1]), r"cumsum\.train\.peak_tflops: expected float or str"),
        ("tokenize", lambda p: p["tokenize"].update(kind="bytes"), r"cumsum\.tokenize\.kind"),
        ("tokenize", lambda p: p["tokenize"].update(vocab_size=100),
         r"cumsum\.tokenize\.vocab_size: applies to kind: bpe only, not word"),
        ("tokenize", lambda p: p["tokenize"].update(split_punctuation=True),
         r"cumsum\.tokenize\.split_punctuation: applies to kind: bpe only, not word"),
        ("prepare", lambda p: p["prepare"].update(max_length=1), r"cumsum\.prepare\.max_length: must be >="),
        ("prepare", lambda p: p["prepare"].update(modulus=1),
         r"cumsum\.prepare\.modulus: must be 0 \(plain sums\) or > 1"),
        ("prepare", lambda p: p["prepare"].update(seed=2**64),
         r"cumsum\.prepare\.seed: 18446744073709551616 is not in"),
        ("train", lambda p: p["train"].update(seed=-1), r"cumsum\.train\.seed: -1 is not in \[0, 2\*\*32\)"),
        ("evaluate", lambda p: p["evaluate"].update(n_samples=-1), r"cumsum\.evaluate\.n_samples"),
        # YAML's .inf and .nan: a learning rate, a RoPE base or a decay of inf trains to NaN or to nothing
        ("train", lambda p: p["train"].update(lr_factor=float("inf")),
         r"^cumsum\.train\.lr_factor: expected a finite number, got inf$"),
        ("train", lambda p: p["train"]["model"].update(rope_base=float("inf")),
         r"^cumsum\.train\.model\.rope_base: expected a finite number, got inf$"),
        ("train", lambda p: p["train"].update(peak_tflops=float("inf")),  # float | str: the finite check still
         r"^cumsum\.train\.peak_tflops: expected a finite number, got inf$"),
        ("train", lambda p: p["train"].update(clip_norm=float("nan")),
         r"^cumsum\.train\.clip_norm: expected a finite number, got nan$"),
        ("evaluate", lambda p: p["evaluate"].update(alpha=-float("inf")),
         r"^cumsum\.evaluate\.alpha: expected a finite number, got -inf$"),
    ],
)
def test_bad_values_name_the_key(tiny_params, stage, edit, message):
    edit(tiny_params["cumsum"])
    with pytest.raises(ConfigError, match=message):
        stage_config(tiny_params, "cumsum", stage)


def test_unknown_task_is_named(tiny_params):
    tiny_params["tasks"] = ["cumsun"]
    with pytest.raises(ConfigError, match=r"tasks: unknown task 'cumsun'"):
        stage_config(tiny_params, "cumsun", "prepare")
    for listed in ("multi30K", None):  # beside the task: the index stage, which dvc repro runs first, names it;
        tiny_params["tasks"] = ["cumsum", listed]  # cumsum's own stages run none of another task's code
        with pytest.raises(ConfigError, match=rf"^tasks: unknown task {listed!r} \(known: cumsum, multi30k, "):
            check_tasks(tiny_params)
        assert stage_config(tiny_params, "cumsum", "prepare").n_train == 400
    tiny_params["tasks"] = "cumsum"  # a name, not a list
    with pytest.raises(ConfigError, match=r"tasks: expected a list of task names \(tasks: \[cumsum\]\), got 'cumsum'$"):
        stage_config(tiny_params, "cumsum", "prepare")


def test_valid_params_give_frozen_configs(tiny_params):
    cfg = stage_config(tiny_params, "cumsum", "train")
    assert cfg.model.head_dim == 8
    with pytest.raises(AttributeError):
        cfg.epochs = 5


def edit_params(tiny_params, section, key, value):
    """Set (or, with value None, delete) tiny_params[section...][key]."""
    node = tiny_params
    for part in section.split("."):
        node = node[part]
    if value is None:
        del node[key]
    else:
        node[key] = value
    return tiny_params


# Each case runs the stage's main as its command does, in this process (conftest.run_stage; the two tests after
# these run the command itself): the message names the key, the exit is 2, nothing is written.
STAGE_CASES = [
    ("prepare", "cumsum.prepare", "n_trian", 5, "cumsum.prepare.n_trian: unknown key"),
    ("prepare", "cumsum.prepare", "n_train", None, "cumsum.prepare.n_train: missing key"),
    ("prepare", "cumsum.prepare", "n_test", "2000", "cumsum.prepare.n_test: expected int, got '2000'"),
    ("prepare", "cumsum.prepare", "n_valid", 0, "cumsum.prepare.n_valid: must be > 0"),
    ("train", "cumsum.train.model", "n_heads", 3, "cumsum.train.model.d_model: 16 is not divisible by n_heads 3"),
    ("train", "cumsum.train.model", "dropout", 1.5, "cumsum.train.model.dropout: must be in [0, 1)"),
    ("train", "cumsum.train", "max_tokens", -1, "cumsum.train.max_tokens: must be > 0"),
    ("tokenize", "cumsum.tokenize", "kind", "bpe", "cumsum.tokenize.vocab_size: bpe needs a vocab_size above"),
    ("train", "", "tasks", ["cumsum", "cumsun"], "tasks: 'cumsum' is not listed"),
    ("train", "cumsum.train", "too_long", "truncate", "cumsum.train.too_long: 'truncate' is not one of fail, skip"),
    ("evaluate", "cumsum.evaluate", "beam_size", 0, "cumsum.evaluate.beam_size: 0: must be in [1, 1000] (1: greedy)"),
    ("train", "cumsum.train", "clip_norm", -1.0, "cumsum.train.clip_norm: must be >= 0 (0: no clipping)"),
    ("train", "cumsum.train", "batch_unit", "tokens", "cumsum.train.batch_unit: 'tokens' is not one of padded, real"),
    ("train", "cumsum.train", "average", "best", "cumsum.train.average: 'best' is not one of if_better, always"),
    ("train", "cumsum.train", "log_every", 0, "cumsum.train.log_every: must be > 0"),
    ("train", "cumsum.train.model", "attention_dropout", 1.0,
     "cumsum.train.model.attention_dropout: must be in [0, 1), or null (the same as dropout)"),
    ("evaluate", "cumsum.evaluate", "device", "gpu",
     "cumsum.evaluate.device: 'gpu' is not one of auto, cpu, cuda, mps"),
]


@pytest.mark.parametrize("stage, section, key, value, message", STAGE_CASES)
def test_stage_command_fails_cleanly_and_writes_nothing(tmp_path, capsys, tiny_params, stage, section, key, value,
                                                         message):
    if section:
        edit_params(tiny_params, section, key, value)
    else:
        tiny_params[key] = value
    if key == "tasks":  # the task asked for is not the one listed
        tiny_params["tasks"] = ["shakespeare"]
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    outs = {"prepare": ["--source", "src", "--out", "data"], "tokenize": ["--data", "data", "--out", "tok"],
            "train": ["--data", "data", "--tokenizer", "tok", "--model", "model.pt",
                      "--checkpoints", "ckpt", "--live", "live"],
            "evaluate": ["--data", "data", "--tokenizer", "tok", "--model", "model.pt", "--metrics", "m.json",
                         "--samples", "s.jsonl", "--lengths", "l.csv", "--generation", "g.json"]}[stage]
    outs = [str(tmp_path / o) if not o.startswith("--") else o for o in outs]
    assert run_stage(stage, ["cumsum", *outs, "--params", str(params)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [params]


def test_a_stage_path_starting_with_a_tilde_is_in_the_home_directory(tmp_path, monkeypatch, tiny_params):
    """A stage's --options read a leading ~ as the home directory, also where the shell leaves it as it is
    (--out=~/data, a quoted "~/data", a command run from Python)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where a literal "~" directory would come
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params))
    assert run_stage("fetch", ["cumsum", "--out=~/sources", "--params=~/params.yaml"]) == 0
    assert run_stage("prepare", ["cumsum", "--source=~/sources", "--out=~/data", "--params=~/params.yaml"]) == 0
    assert run_stage("tokenize", ["cumsum", "--data", "~/data", "--out", "~/tok", "--params", "~/params.yaml"]) == 0
    assert (tmp_path / "data" / "train.parquet").is_file() and (tmp_path / "tok" / "tokenizer.json").is_file()
    assert list((tmp_path / "cwd").iterdir()) == []


LOST = ", which writing it would lose (name another path)"  # what an output that is or holds another path says
CHANGED = " stage wrote; writing there would replace or change it (name a path outside it)"  # one in a directory read


@pytest.mark.parametrize("stage, paths, message", [
    ("tokenize", {"data": "data", "out": "data"}, "--out data: is --data data" + LOST),
    ("tokenize", {"data": "data", "out": "."}, "--out .: holds --data data" + LOST),
    ("evaluate", {"data": "data", "tokenizer": "tok", "model": "model.pt", "metrics": "out.json",
                  "samples": "out.json", "lengths": "l.csv", "generation": "g.json"},
     "--metrics out.json: is --samples out.json" + LOST),
    ("evaluate", {"data": "data", "tokenizer": "tok", "model": "model.pt", "metrics": "params.yaml",
                  "samples": "samples.jsonl", "lengths": "l.csv", "generation": "g.json"},
     "--metrics params.yaml: is --params params.yaml" + LOST),
    ("train", {"data": "data", "tokenizer": "tok", "model": "ckpt/model.pt", "checkpoints": "ckpt", "live": "live"},
     "--checkpoints ckpt: holds --model ckpt/model.pt" + LOST),
    ("train", {"data": "data", "tokenizer": "tok", "model": "model.pt", "checkpoints": "ckpt", "live": "link"},
     "--live link: is --data data" + LOST),
    ("evaluate", {"data": "data", "tokenizer": "tok", "model": "model.pt", "metrics": "metrics.json",
                  "samples": "data/test.parquet", "lengths": "l.csv", "generation": "g.json"},
     "--samples data/test.parquet: is in --data data, which the prepare"
     + CHANGED),
    ("tokenize", {"data": "data", "out": "link/tok"}, "--out link/tok: is in --data data, which the prepare" + CHANGED),
    ("report", {"data": "data", "tokenizer": "tok", "model": "model.pt", "metrics": "metrics.json",
                "samples": "samples.jsonl", "lengths": "l.csv", "live": "live", "out": "report.md",
                "page": "report.html", "card": "card.html", "figures": "tok/figures", "losses": "losses.csv",
                "scores": "scores.csv"},
     "--figures tok/figures: is in --tokenizer tok, which the tokenize" + CHANGED),
])
def test_a_stage_output_that_is_holds_or_is_in_another_of_its_paths_is_refused(tmp_path, monkeypatch, capsys,
                                                                                tiny_params, stage, paths, message):
    """A stage replaces what it writes whole (a directory with all it holds): run by hand (under torchrun,
    say) with `--out` naming its `--data`, the tokenize stage put its tokenizer where the data had been, the
    data gone; evaluate's `--samples data/test.parquet` replaced the test split (and a file more in a
    directory read changes what `dvc repro` took for that stage's output). Each output is checked against
    every other path the stage is given, links followed, before any work; beside them is written."""
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text(yaml.safe_dump(tiny_params))
    assert run_stage("fetch", ["cumsum", "--out", "sources"]) == 0
    assert run_stage("prepare", ["cumsum", "--source", "sources", "--out", "data"]) == 0
    (tmp_path / "link").symlink_to("data")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    argv = [part for name, path in paths.items() for part in (f"--{name}", path)]
    assert run_stage(stage, ["cumsum", *argv]) == 2
    assert capsys.readouterr().err.endswith(f"{stage}@cumsum: error: {message}\n")
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
    assert run_stage("tokenize", ["cumsum", "--data", "data", "--out", "tok"]) == 0  # beside it
    assert (tmp_path / "tok" / "tokenizer.json").is_file()


LM_PARAMS = {"fetch": {"source": "no/such/input.txt"}, "prepare": {"train_fraction": 0.9},  # train never reads it
             "tokenize": {"kind": "char", "min_frequency": 1},
             "train": {"seed": 0, "device": "cpu", "max_iters": 4, "batch_size": 2, "block_size": 16,
                       "schedule": "cosine", "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "weight_decay": 0.1,
                       "beta2": 0.99, "clip_norm": 1.0, "eval_every": 2, "eval_batches": 1, "checkpoint_every": 2,
                       "model": {"d_model": 16, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 1, "d_ff": 32,
                                 "dropout": 0.0, "norm_first": True, "tie_embeddings": True, "fused_qkv": True,
                                 "max_len": 16}},
             "evaluate": {"prompts": ["RO"], "max_new_tokens": 4, "temperature": 1.0, "top_k": 0, "seed": 0},
             "report": {"passage_tokens": 8}}


@pytest.mark.parametrize("task, stage, section, key, value, message", [
    ("cumsum", "prepare", "cumsum.evaluate", "beam_size", 0,
     "cumsum.evaluate.beam_size: 0: must be in [1, 1000] (1: greedy) (found before prepare starts: each stage "
     "checks the params of those after it)"),
    ("cumsum", "tokenize", "cumsum.report", "n_attention_examples", 0, "cumsum.report.n_attention_examples: must "
     "be > 0 (found before tokenize starts"),
    ("cumsum", "train", "cumsum.evaluate", "alpha", 1000, "cumsum.evaluate.alpha: 1000.0: the length penalty "
     "((5 + length) / 6) ** alpha overflows float32 at cumsum.train.model.max_len 32 for an alpha above 48.8 "
     "(GNMT's: 0.6 to 1) (found before train starts"),
    ("shakespeare", "train", "shakespeare.report", "passage_tokens", 17, "shakespeare.report.passage_tokens: 17 is "
     "longer than the blocks the model trains on (shakespeare.train.block_size 16) (found before train starts"),
])
def test_a_later_stages_mistake_is_named_before_the_work_ahead_of_it(tmp_path, capsys, tiny_params, task, stage,
                                                                      section, key, value, message):
    """A mistake in evaluate's or report's params (or one they make with train's) failed only when that stage
    ran: after training, tens of minutes of it for multi30k. Each stage now checks those after it first; the
    params of the stages before it (shakespeare's fetch source, not on this machine) are not asked for."""
    tiny_params["tasks"], tiny_params["shakespeare"] = [task], copy.deepcopy(LM_PARAMS)
    tiny_params["cumsum"]["evaluate"]["beam_size"] = 2  # alpha is beam search's: greedy search has no penalty
    right = yaml.safe_dump(tiny_params)
    edit_params(tiny_params, section, key, value)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    paths = {"prepare": ["--source", "--out"], "tokenize": ["--data", "--out"],
             "train": ["--data", "--tokenizer", "--model", "--checkpoints", "--live"]}[stage]
    argv = [part for option in paths for part in (option, str(tmp_path / option.strip("-")))]
    assert run_stage(stage, [task, *argv, "--params", str(params)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [params]
    params.write_text(right)  # the later sections right: on to the stage's work (prepare's), or to its inputs,
    run_stage(stage, [task, *argv, "--params", str(params)])  # not here (the others'): named, not the params
    assert "found before" not in capsys.readouterr().err


def test_greedy_searchs_unused_alpha_is_not_held_against_it(tiny_params):
    """The evaluate stage takes any alpha with beam_size 1 (greedy search ranks by the next token alone), so
    the stages before it do too; beam search's is held to the bound."""
    tiny_params["cumsum"]["evaluate"]["alpha"] = 1000.0
    check_stages_after(tiny_params, "cumsum", "train")
    tiny_params["cumsum"]["evaluate"]["beam_size"] = 2
    with pytest.raises(ConfigError, match=r"^cumsum\.evaluate\.alpha: 1000\.0: the length penalty"):
        check_stages_after(tiny_params, "cumsum", "train")


def test_missing_local_source_is_named(tiny_params):
    tiny_params["tasks"] = ["shakespeare"]
    tiny_params["shakespeare"] = {"fetch": {"source": "no/such/input.txt"}, "prepare": {"train_fraction": 0.9}}
    with pytest.raises(ConfigError, match=r"shakespeare\.fetch\.source: no/such/input.txt: no such file"):
        stage_config(tiny_params, "shakespeare", "fetch")


def test_params_file_that_is_not_yaml_is_named_by_line(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("tasks: [cumsum\ncumsum:\n  prepare: {}\n")
    result = subprocess.run([sys.executable, "-m", "stages.prepare", "cumsum", "--source", str(tmp_path / "sources"),
                             "--out", str(tmp_path / "data"), "--params", str(params)], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 2
    assert f"prepare@cumsum: error: {params}: not valid YAML at line 2" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [params]


def test_reading_params_imports_neither_torch_nor_pandas():
    """A tool that only reads or edits params.yaml, as gpu_check.sh does twice, reads it as the stages do
    without the 3 s that importing torch takes."""
    code = ("import json, sys; "
            "from lib.core.text import load_params; load_params('params.yaml'); print(json.dumps([*sys.modules]))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert {"torch", "pandas"} & set(json.loads(result.stdout)) == set()


@pytest.mark.parametrize("written, read", [
    ("lr_factor: 3e-4", 3e-4),  # YAML 1.1: the text '3e-4', which the stage refused
    ("seed: 010", 10),  # YAML 1.1: octal, 8
    ("seed: 0o10", 8),  # YAML 1.1: the text '0o10'
])
def test_a_value_is_read_as_dvc_reads_it(tmp_path, tiny_params, written, read):
    """DVC reads params.yaml as YAML 1.2 (ruamel); PyYAML's YAML 1.1 read these otherwise, so a stage
    trained with a value that `dvc params diff` did not show, or refused one that it did."""
    from dvc.utils.serialize import parse_yaml

    key = written.split(":")[0]
    text = yaml.safe_dump(tiny_params).replace(f"{key}: {tiny_params['cumsum']['train'][key]}\n", written + "\n")
    assert written in text
    (tmp_path / "params.yaml").write_text(text)
    params = load_params(tmp_path / "params.yaml")
    assert params == parse_yaml(text, "params.yaml")  # as DVC reads it
    assert getattr(stage_config(params, "cumsum", "train"), key) == read


def test_yamls_infinity_is_refused_where_it_was_taken(tmp_path, tiny_params):
    """`lr_factor: .inf` (YAML 1.2's infinity, as DVC reads it) was taken, and training diverged at step 2."""
    text = yaml.safe_dump(tiny_params).replace("lr_factor: 1.0\n", "lr_factor: .inf\n")
    assert "lr_factor: .inf" in text
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"^cumsum\.train\.lr_factor: expected a finite number, got inf$"):
        stage_config(load_params(tmp_path / "params.yaml"), "cumsum", "train")


@pytest.mark.parametrize("written", ["yes", "off"])
def test_a_yaml_1_1_boolean_is_refused_with_what_to_write(tmp_path, tiny_params, written):
    """YAML 1.1 read yes/no/on/off as booleans, YAML 1.2 (DVC) as words: the stage took `off` as false
    while `dvc params diff` showed the word 'off'."""
    text = yaml.safe_dump(tiny_params).replace("norm_first: false", f"norm_first: {written}")
    assert f"norm_first: {written}" in text
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        stage_config(load_params(tmp_path / "params.yaml"), "cumsum", "train")
    assert str(err.value) == (f"cumsum.train.model.norm_first: expected bool, got '{written}' (write true or "
                              "false: YAML 1.2, as DVC reads params.yaml, takes yes, no, on and off as words)")


def test_a_key_given_twice_is_named(tmp_path, tiny_params):
    """A copied line (`seed:` twice in one section): a stage run by hand quietly took the last value, where
    `dvc repro` refuses the file."""
    text = yaml.safe_dump(tiny_params).replace("  train:\n", "  train:\n    seed: 3\n", 1)
    lines = text.splitlines()
    first = lines.index("    seed: 3") + 1  # train's first key, where its mapping begins
    second = lines.index(f"    seed: {tiny_params['cumsum']['train']['seed']}", first) + 1
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_params(tmp_path / "params.yaml")
    assert str(err.value) == (f"{tmp_path / 'params.yaml'}: not valid YAML at line {second}, column 5: found "
                              f'duplicate key "seed" with value "0" (original value: "3") (while constructing '
                              f"a mapping from line {first}, column 5)")


@pytest.mark.parametrize("content, message", [
    (None, "a directory, where the params file is read"),
    (b"tasks: [cumsum]\n# caf\xe9 au lait\n", "line 2: not UTF-8 (byte 5)"),  # Latin-1, from an old editor
    (b"cumsum:\n  prepare:\n    seed: 2026-13-45\n",
     "not valid YAML: month must be in 1..12 (a date or a tagged value written wrongly)"),
])
def test_a_params_file_that_cannot_be_read_is_named(tmp_path, content, message):
    """Each was a message without the file (`'utf-8' codec can't decode byte 0xe9 ...`, `month must be in
    1..12`) or a wrong one (a directory: "params file not found")."""
    params = tmp_path / "params.yaml"
    if content is None:
        params.mkdir()
    else:
        params.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_params(params)
    assert str(err.value) == f"{params}: {message}"


def test_a_data_directory_without_its_splits_is_named(tmp_path, tiny_params):
    """The command as typed: --data names a directory (a missing one: test_stages), but not one prepare wrote."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params))
    (tmp_path / "elsewhere").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "stages.tokenize", "cumsum", "--data", str(tmp_path / "elsewhere"),
         "--out", str(tmp_path / "tok"), "--params", str(params)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert result.stderr == (f"tokenize@cumsum: error: {tmp_path / 'elsewhere' / 'train.parquet'}: split not found "
                             "(run the prepare stage first)\n")
    assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize("declared, said", [
    ({"name": "reverse"}, "lib.tasks.cumsum.Wrong: name 'reverse' differs from its file lib/tasks/cumsum.py"),
    ({"name": "cumsum", "valid_metric": "bleu"},
     "lib.tasks.cumsum.Wrong: valid_metric 'bleu' is not among its scores (exact_match)"),
    ({"name": "cumsum", "headline": ("greedy.exact_match", "greedy.blue")},
     "lib.tasks.cumsum.Wrong: headline 'greedy.blue' matches none of the metrics its evaluate stage writes (n_test, "),
])
def test_a_tasks_hooks_are_checked_as_its_class_is_defined(declared, said):
    """A misspelt hook fails at import, naming the task and the hook, not later as nothing shown or "unknown"."""
    from lib.tasks.base import Task

    with pytest.raises(ConfigError) as raised:
        type("Wrong", (Task,), {"__module__": "lib.tasks.cumsum", **declared})
    assert str(raised.value).startswith(said)
