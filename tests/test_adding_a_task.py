"""docs/adding-a-task.md, followed as written: its task module and its params section in a temporary repo, then
`dvc exp run` takes the new task through every stage."""

import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from tests.conftest import DVC, ROOT, TINY_PARAMS, code_not_in_deps, dvc_repo, sh, stages_run

pytestmark = [pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
              pytest.mark.slow]  # a real dvc exp run through every stage


GUIDE = (ROOT / "docs" / "adding-a-task.md").read_text()


def block(language: str) -> str:
    [found] = re.findall(rf"```{language}\n(.*?)```", GUIDE, flags=re.S)
    return found


def test_the_guides_task_runs_through_every_stage(tmp_path):
    section = yaml.safe_load(block("yaml"))["reverse"]
    # The guide's section, made small enough for a test: fewer pairs, a smaller model, two epochs.
    section["prepare"].update(n_train=300, n_test=30, max_length=5)
    section["train"].update(device="cpu", epochs=2, max_tokens=256, warmup=10, checkpoint_every=5)
    section["train"]["model"].update(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=32, max_len=32)
    repo, env, loaded = dvc_repo(tmp_path, {**TINY_PARAMS, "reverse": section})
    (repo / "lib" / "tasks" / "reverse.py").write_text(block("python"))
    sh(sys.executable, "-m", "tools.deps", cwd=repo, env=env)  # the guide's one command after adding a module

    ran = sh(DVC, "exp", "run", "-S", "tasks=[reverse]", cwd=repo, env=env)
    assert stages_run(ran) == {"index"} | {f"{stage}@reverse" for stage in ("fetch", "prepare", "tokenize", "train",
                                                                            "evaluate", "report")}
    assert code_not_in_deps(loaded, repo) == {}
    metrics = json.loads((repo / "reports/reverse/metrics.json").read_text())
    assert 0 <= metrics["greedy"]["exact_match"] <= 1 and metrics["n_test"] == 30
    test = pd.read_parquet(repo / "data/reverse/test.parquet")
    assert all(t.split() == s.split()[::-1] for s, t in zip(test["src"], test["tgt"]))
    assert "exact match by source length" in (repo / "reports/reverse/report.md").read_text()
    assert "Reverse: digit sequences in" in (repo / "reports/index.html").read_text()  # its card, described

    # The task list comes from the classes: a misspelt name is told the new one among those it knows.
    wrong = subprocess.run([DVC, "exp", "run", "-S", "tasks=[revers]"], cwd=repo, env=env, capture_output=True,
                           text=True)
    assert wrong.returncode != 0
    assert "unknown task 'revers' (known: cumsum, multi30k, reverse, shakespeare, wmt14)" in wrong.stdout + wrong.stderr
