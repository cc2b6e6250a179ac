"""One real `dvc repro` of the whole pipeline on tiny params, in a temporary git repo."""

import json
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
        match = re.search(r"stages/(\w+)\.py (\w+)?", argv)
        assert match, argv
        stage, task = match.groups()
        if task is None:  # a stage run once (index)
            deps, task = set(stages[stage]["deps"]), ""
        else:
            assert task in params["tasks"], argv
            deps = {dep.replace("${item}", task) for dep in stages[stage]["do"]["deps"]}
        files = {str(path.relative_to(repo)) for name in names for path in module_files(repo, name)}
        unlisted = {file for file in files - {"lib/__init__.py", "stages/__init__.py"}
                    if not any(file == dep or file.startswith(dep + "/") for dep in deps)}  # a directory: its files
        if unlisted:
            missing[f"{stage}@{task}" if task else stage] = sorted(unlisted)
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
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")  # the train/validation loss template
    sh("git", "add", "-A", cwd=repo, env=env)
    sh("git", "commit", "-qm", "tiny pipeline", cwd=repo, env=env)

    first = sh(dvc, "repro", cwd=repo, env=env)
    assert stages_run(first) == {"index"} | {f"{s}@cumsum" for s in ("fetch", "prepare", "tokenize", "train",
                                                                        "evaluate", "report")}
    for path in ("sources/cumsum/manifest.json", "data/cumsum/train.parquet", "models/cumsum/tokenizer/tokenizer.json",
                 "models/cumsum/model.pt", "reports/cumsum/metrics.json", "reports/cumsum/samples.jsonl",
                 "reports/cumsum/report.md", "reports/cumsum/report.html", "reports/cumsum/card.html",
                 "reports/cumsum/figures/loss.png", "reports/cumsum/figures/cross_attention_1.png",
                 "reports/cumsum/figures/by_length.png", "reports/index.html"):
        assert (repo / path).is_file(), path

    assert code_not_in_deps(loaded, repo) == {}

    second = sh(dvc, "repro", cwd=repo, env=env)
    assert stages_run(second) == set()
    assert "up to date" in sh(dvc, "status", cwd=repo, env=env)

    # The small metrics and plot tables are git's (cache: false), the rest DVC's: committed, a fresh clone
    # (no DVC cache, no remote) shows the baseline's metrics, and diffs them
    sh("git", "add", "-A", cwd=repo, env=env)
    sh("git", "commit", "-qm", "baseline", cwd=repo, env=env)
    assert sh("git", "ls-files", "reports", cwd=repo, env=env).split() == [
        f"reports/cumsum/{name}" for name in ("by_length.csv", "losses.csv", "metrics.json", "train/metrics.json",
                                              "valid_score.csv")]
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(repo), str(clone), cwd=tmp_path, env=env)
    shown = json.loads(sh(dvc, "exp", "show", "--json", cwd=clone, env=env))
    baseline = next(row for row in shown if row["rev"] == "workspace")["data"]["metrics"]
    assert baseline["reports/cumsum/metrics.json"]["data"] == json.loads(
        (repo / "reports/cumsum/metrics.json").read_text())
    assert "step" in baseline["reports/cumsum/train/metrics.json"]["data"]
    sh(dvc, "metrics", "diff", "HEAD~1", cwd=clone, env=env)  # the commit before had none: all new

    # An experiment that redraws the report: its figures and loss chart beside the baseline's
    third = sh(dvc, "exp", "run", "-n", "fewer", "-S", "cumsum.evaluate.n_samples=5", cwd=repo, env=env)
    assert stages_run(third) == {"evaluate@cumsum", "report@cumsum"}
    metrics = sh(dvc, "metrics", "show", cwd=repo, env=env)
    assert "greedy.exact_match" in metrics and "valid.loss" in metrics and "by_length" not in metrics
    plots = json.loads(sh(dvc, "plots", "show", "--json", cwd=repo, env=env))
    assert not plots.get("errors")
    losses = plots["data"]["reports/cumsum/losses.csv"][0]["content"]
    assert {row["split"] for row in losses["data"]["values"]} == {"train", "valid"}  # one chart, both
    diff = json.loads(sh(dvc, "plots", "diff", "HEAD", "fewer", "--json", cwd=repo, env=env))["data"]
    assert [image["revisions"] for image in diff["reports/cumsum/figures/loss.png"]] == [["HEAD"], ["fewer"]]
    assert sorted(losses_rev["rev"] for losses_rev in diff["reports/cumsum/losses.csv"][0]["content"]["data"]["values"]
                  if losses_rev["step"] == "1" and losses_rev["split"] == "train") == ["HEAD", "fewer"]


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
