"""One real `dvc repro` of the whole pipeline on tiny params, in a temporary git repo."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from lib.identity import module_files
from tests.conftest import ROOT, TINY_PARAMS

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def sh(*cmd, cwd, env):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def stages_run(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


# Loaded into every Python process of the test's `dvc repro` (PYTHONPATH): a stage process writes, as it
# exits, its command line and the project's modules it ran.
RECORD_MODULES = """import atexit, os, sys


def record():
    if os.sep + "stages" + os.sep in sys.argv[0]:  # python -m stages.train: argv[0] is .../stages/train.py
        names = sorted(m for m in sys.modules if m.split(".")[0] in ("lib", "stages", "transformer"))
        with open(os.path.join(os.environ["RECORD_MODULES"], str(os.getpid())), "w") as f:
            f.write(" ".join(sys.argv) + "\\n" + "\\n".join(names) + "\\n")


atexit.register(record)
"""


def code_not_in_deps(loaded, repo) -> dict:
    """For each stage that ran: the project's files it loaded that its dvc.yaml entry does not list
    (a change there would leave its outputs stale: dvc repro would not run it again)."""
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((repo / "params.yaml").read_text())
    missing = {}
    for record in loaded.iterdir():
        argv, *names = record.read_text().splitlines()
        match = re.search(r"stages/(\w+)\.py (\w+)", argv)
        assert match, argv
        stage, task = match.groups()
        assert task in params["tasks"], argv
        deps = {dep.replace("${item}", task) for dep in stages[stage]["do"]["deps"]}
        files = {str(path.relative_to(repo)) for name in names for path in module_files(repo, name)}
        unlisted = files - deps - {"lib/__init__.py", "stages/__init__.py"}
        if unlisted:
            missing[f"{stage}@{task}"] = sorted(unlisted)
    assert len(list(loaded.iterdir())) >= 5, "every stage's process records what it loaded"
    return missing


def test_dvc_repro_end_to_end(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("lib", "stages", "transformer"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, repo / name)
    (repo / "params.yaml").write_text(yaml.safe_dump(TINY_PARAMS))
    bin_dir = os.path.dirname(sys.executable)
    site, loaded = tmp_path / "site", tmp_path / "loaded"
    site.mkdir(), loaded.mkdir()
    (site / "sitecustomize.py").write_text(RECORD_MODULES)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(site), "RECORD_MODULES": str(loaded),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    dvc = os.path.join(bin_dir, "dvc")
    sh("git", "init", "-q", cwd=repo, env=env)
    sh(dvc, "init", "-q", cwd=repo, env=env)
    sh(dvc, "config", "core.analytics", "false", cwd=repo, env=env)
    sh("git", "add", "-A", cwd=repo, env=env)
    sh("git", "commit", "-qm", "tiny pipeline", cwd=repo, env=env)

    first = sh(dvc, "repro", cwd=repo, env=env)
    assert stages_run(first) == {f"{s}@cumsum" for s in ("prepare", "tokenize", "train", "evaluate", "report")}
    for path in ("data/cumsum/train.parquet", "models/cumsum/tokenizer/tokenizer.json", "models/cumsum/model.pt",
                 "reports/cumsum/metrics.json", "reports/cumsum/samples.jsonl", "reports/cumsum/report.md",
                 "reports/cumsum/figures/loss.png", "reports/cumsum/figures/cross_attention_1.png",
                 "reports/cumsum/figures/by_length.png", "reports/index.md"):
        assert (repo / path).is_file(), path

    assert code_not_in_deps(loaded, repo) == {}

    second = sh(dvc, "repro", cwd=repo, env=env)
    assert stages_run(second) == set()
    assert "up to date" in sh(dvc, "status", cwd=repo, env=env)

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["cumsum"]["evaluate"]["n_samples"] = 5
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    third = sh(dvc, "repro", cwd=repo, env=env)
    assert stages_run(third) == {"evaluate@cumsum", "report@cumsum"}

    metrics = sh(dvc, "metrics", "show", cwd=repo, env=env)
    assert "greedy.exact_match" in metrics and "valid.loss" in metrics
    sh(dvc, "plots", "show", "-o", str(tmp_path / "plots"), cwd=repo, env=env)
    page = (tmp_path / "plots" / "index.html").read_text()
    assert "train/loss.tsv" in page and "valid/loss.tsv" in page


@pytest.mark.parametrize("task", ["cumsum", "multi30k", "shakespeare"])
def test_a_checkpoint_is_tied_to_exactly_the_code_dvc_reruns_training_for(task):
    """Resume refuses a checkpoint when training's code changed (training_code's fingerprint); DVC reruns
    train when its deps change. The two lists must agree: a file in the fingerprint only would throw away
    an interrupted run's progress for an edit to, say, the report's plots; a dep only would resume a
    model trained by other code."""
    from lib.identity import training_code

    deps = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["train"]["do"]["deps"]
    code_deps = {dep.replace("${item}", task) for dep in deps if dep.startswith(("lib/", "transformer/"))}
    code = {str(path.relative_to(ROOT)) for path in training_code(task)} - {"lib/__init__.py"}
    assert code == code_deps - {"lib/cli.py", "lib/params.py"}  # the stage script's helpers, not training's
