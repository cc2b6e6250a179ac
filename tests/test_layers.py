"""The layers of pyproject.toml's [tool.importlinter] hold: each folder imports only from the folders below it,
so no import cycle can form, the model package imports nothing of the pipeline, and training imports nothing
of what evaluates, reports or serves."""

import ast
import os
import shutil
import subprocess
import sys

from tests.conftest import ROOT

LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"


def lint(root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)})


def test_the_project_keeps_its_layers():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_a_planted_cycle_or_an_upward_import_breaks_the_contract(tmp_path):
    """The contract is over folders: data importing train, train importing the evaluate stage's searches, the model
    package importing the pipeline, greedy search importing beam search, and a tool importing a study each
    break it."""
    for part in ("benchmarks", "tools", "lib", "stages", "transformer", "pyproject.toml"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy
        copy(ROOT / part, tmp_path / part)
    planted = {"lib/data/pairs.py": "from lib.train import training",  # training imports the data
               "lib/train/run.py": "from lib.evaluate import decode",
               "transformer/attention.py": "from lib.core import config",
               "transformer/greedy.py": "from transformer import beam",
               "tools/mutants.py": "from benchmarks.throughput import same_results"}  # a tool needing a study
    for name, line in planted.items():
        module = tmp_path / name
        module.write_text(module.read_text() + f"\n{line}  # noqa: E402\n")
    done = lint(tmp_path)
    assert done.returncode != 0
    assert "0 broken" not in done.stdout
    for upward in ("lib.data.pairs -> lib.train.training", "lib.train.run -> lib.evaluate.decode",
                   "transformer.attention -> lib.core.config", "transformer.greedy -> transformer.beam",
                   "tools.mutants -> benchmarks.throughput.same_results"):
        assert upward in done.stdout, upward


LIMITS = {"file": 300, "function": 60, "class": 150}  # lines: what a reader takes in at once


def test_no_file_function_or_class_of_the_pipeline_or_the_model_is_too_long_to_read():
    too_long = []
    for path in sorted([*(ROOT / "lib").rglob("*.py"), *(ROOT / "transformer").rglob("*.py")]):
        text = path.read_text()
        name = path.relative_to(ROOT)
        if text.count("\n") > LIMITS["file"]:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            kinds = {ast.FunctionDef: "function", ast.AsyncFunctionDef: "function", ast.ClassDef: "class"}
            kind = kinds.get(type(node))
            if kind and node.end_lineno - node.lineno + 1 > LIMITS[kind]:
                too_long.append(f"{name}:{node.lineno} {kind} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []
