"""The layers of .importlinter hold: each module imports only from the layers below it, so no import cycle
can form, the model package imports nothing of the pipeline, and evaluation imports nothing of training."""

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
    for part in ("lib", "stages", "transformer", ".importlinter"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy
        copy(ROOT / part, tmp_path / part)
    data = tmp_path / "lib" / "data.py"
    data.write_text(data.read_text() + "\nfrom lib import training  # noqa: E402\n")  # training imports data
    attention = tmp_path / "transformer" / "attention.py"
    attention.write_text(attention.read_text() + "\nfrom lib import config  # noqa: E402\n")
    done = lint(tmp_path)
    assert done.returncode != 0
    assert "0 broken" not in done.stdout
    assert "lib.data -> lib.training" in done.stdout and "transformer.attention -> lib.config" in done.stdout
