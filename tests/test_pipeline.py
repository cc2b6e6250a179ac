"""One real `dvc repro` of the whole pipeline on tiny params, in a temporary git repo, started and explored with
the README's own commands."""

import csv
import functools
import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import DVC, ROOT, TINY_PARAMS, code_not_in_deps, dvc_repo, sh, stages_run
from tests.test_compare import check_a_study_runs_through_the_queue, check_the_comparison_page

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def readme_command(start: str) -> str:
    """The README's command that begins with ``start``, as written (its comment dropped): the lines of its plain
    ``` blocks are what a user pastes into a shell."""
    lines, fence = [], None  # the info string of the block we are in (None: outside one)
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = line[3:] if fence is None else None
        elif fence == "":
            lines.append(line.split("#")[0].strip())
    return next(line for line in lines if line.startswith(start))


def new_users_shell(repo, env, tmp_path) -> dict:
    """The environment of a fresh shell: no venv on PATH, and a `python` without torch first on it. The repo's
    .venv is the project's, which `make` keeps (its stamp is newer than the lock, copied with its time)."""
    stamp, lock = ROOT / ".venv" / ".installed", ROOT / "requirements.lock"
    assert stamp.stat().st_mtime >= lock.stat().st_mtime, "the venv predates requirements.lock: run make first"
    (repo / ".venv").symlink_to(ROOT / ".venv")
    for name in ("Makefile", "requirements.txt", "requirements.lock"):
        shutil.copy2(ROOT / name, repo / name)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "python").symlink_to(shutil.which("python3", path="/usr/bin:/bin"))
    shell = {**env, "PATH": f"{bare}:/usr/bin:/bin"}
    assert subprocess.run(["python", "-c", "import torch"], env=shell, capture_output=True).returncode != 0
    return shell


def in_the_venv(command: str, repo, shell: dict) -> str:
    """``command`` after the README's activation line, in one bash."""
    return sh("bash", "-c", f"{readme_command('source .venv/bin/activate')} && {command}", cwd=repo, env=shell)


@pytest.mark.slow
def test_dvc_repro_end_to_end(tmp_path):
    repo, env, loaded = dvc_repo(tmp_path, TINY_PARAMS)
    shell = new_users_shell(repo, env, tmp_path)
    first = sh("bash", "-c", readme_command("make repro"), cwd=repo, env=shell)
    assert stages_run(first) == {"index"} | {f"{s}@cumsum" for s in ("fetch", "prepare", "tokenize", "train",
                                                                        "evaluate", "report")}
    for path in ("sources/cumsum/manifest.json", "data/cumsum/train.parquet", "models/cumsum/tokenizer/tokenizer.json",
                 "models/cumsum/model.pt", "reports/cumsum/metrics.json", "reports/cumsum/samples.jsonl",
                 "reports/cumsum/report.md", "reports/cumsum/report.html", "reports/cumsum/card.html",
                 "reports/cumsum/figures/loss.png", "reports/cumsum/figures/cross_attention_1.png",
                 "reports/cumsum/figures/by_length.png", "reports/index.html"):
        assert (repo / path).is_file(), path

    assert code_not_in_deps(loaded, repo) == {}

    second = sh(DVC, "repro", cwd=repo, env=env)
    assert stages_run(second) == set()
    assert "up to date" in sh(DVC, "status", cwd=repo, env=env)
    check_edits_rerun_only_the_stages_that_run_them(repo, env)
    check_a_new_task_reruns_no_other_tasks_stage(repo, env)

    # The small metrics and plot tables are git's (cache: false), the rest DVC's: committed, a fresh clone
    # (no DVC cache, no remote) shows the baseline's metrics, and diffs them
    sh("git", "add", "-A", cwd=repo, env=env)
    sh("git", "commit", "-qm", "baseline", cwd=repo, env=env)
    assert sh("git", "ls-files", "reports", cwd=repo, env=env).split() == [
        f"reports/cumsum/{name}" for name in ("by_length.csv", "losses.csv", "metrics.json", "train/metrics.json",
                                              "train/stopped.json", "valid_score.csv")]
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(repo), str(clone), cwd=tmp_path, env=env)
    shown = json.loads(sh(DVC, "exp", "show", "--json", cwd=clone, env=env))
    baseline = next(row for row in shown if row["rev"] == "workspace")["data"]["metrics"]
    assert baseline["reports/cumsum/metrics.json"]["data"] == json.loads(
        (repo / "reports/cumsum/metrics.json").read_text())
    assert "step" in baseline["reports/cumsum/train/metrics.json"]["data"]
    sh(DVC, "metrics", "diff", "HEAD~1", cwd=clone, env=env)  # the commit before had none: all new

    # The README's model in use, and its experiment set against the baseline by python -m lib.use.compare, each
    # as written (tests/test_compare.py reads the page)
    assert re.fullmatch(r"[\d ]+\n", in_the_venv(readme_command("python -m lib.use.generate"), repo, shell))
    experiment = readme_command("dvc exp run -n")
    name, change = re.fullmatch(r"dvc exp run -n (\S+) -S (\S+)", experiment).groups()
    in_the_venv(experiment, repo, shell)
    in_the_venv(readme_command(f"python -m lib.use.compare HEAD {name}"), repo, shell)
    key, value = change.split("=")
    baseline = functools.reduce(lambda section, part: section[part], key.split("."), TINY_PARAMS)
    check_the_comparison_page(repo, env, tmp_path, name, f"`{key}`: {baseline} -> {value}")
    check_a_study_runs_through_the_queue(repo, env)
    check_a_run_starts_from_a_trained_model(repo, env)

    # An experiment that redraws the report: its figures and loss chart beside the baseline's
    third = sh(DVC, "exp", "run", "-n", "fewer", "-S", "cumsum.evaluate.n_samples=5", cwd=repo, env=env)
    assert stages_run(third) == {"evaluate@cumsum", "report@cumsum"}
    metrics = sh(DVC, "metrics", "show", cwd=repo, env=env)
    assert "greedy.exact_match" in metrics and "valid.loss" in metrics and "by_length" not in metrics
    plots = json.loads(sh(DVC, "plots", "show", "--json", cwd=repo, env=env))
    assert not plots.get("errors")
    losses = plots["data"]["reports/cumsum/losses.csv"][0]["content"]
    assert {row["split"] for row in losses["data"]["values"]} == {"train", "valid"}  # one chart, both
    # dvclive's curves are the train stage's plots: drawn from the files it writes as it trains
    assert {"reports/cumsum/train/plots/metrics/train/loss.tsv",
            "reports/cumsum/train/plots/metrics/valid/loss.tsv"} <= set(plots["data"])
    diff = json.loads(sh(DVC, "plots", "diff", "HEAD", "fewer", "--json", cwd=repo, env=env))["data"]
    assert [image["revisions"] for image in diff["reports/cumsum/figures/loss.png"]] == [["HEAD"], ["fewer"]]
    assert sorted(losses_rev["rev"] for losses_rev in diff["reports/cumsum/losses.csv"][0]["content"]["data"]["values"]
                  if losses_rev["step"] == "1" and losses_rev["split"] == "train") == ["HEAD", "fewer"]


def check_a_run_starts_from_a_trained_model(repo, env):
    """Fine-tuning through DVC, as init/README.md says: the workspace's trained model copied under init/, then
    `dvc exp run -S cumsum.train.init_from=init/cumsum`. Its first step's loss is the trained model's, far below
    the first loss of the run from random weights."""
    def losses() -> list[float]:
        with open(repo / "reports/cumsum/train/plots/metrics/train/loss.tsv") as file:
            return [float(row["loss"]) for row in csv.DictReader(file, delimiter="\t")]

    random = losses()
    (repo / "init" / "cumsum").mkdir()
    shutil.copytree(repo / "models/cumsum/tokenizer", repo / "init/cumsum/tokenizer")
    shutil.copyfile(repo / "models/cumsum/model.pt", repo / "init/cumsum/model.pt")
    ran = sh(DVC, "exp", "run", "-n", "tuned", "-S", "cumsum.train.init_from=init/cumsum", cwd=repo, env=env)
    assert "train@cumsum" in stages_run(ran)
    tuned = losses()
    assert tuned[0] < random[-1] + (random[0] - random[-1]) / 4


# Code that training never runs, and the stage it does belong to (None: no stage, only a user runs it).
NOT_TRAINING = {"transformer/beam.py": "evaluate", "transformer/sampling.py": "evaluate",
                "lib/evaluate/decode.py": "evaluate", "lib/evaluate/by_length.py": "evaluate",
                "lib/evaluate/options.py": "evaluate", "lib/report/figures.py": "report",
                "lib/report/sections.py": "report", "lib/tasks/writing.py": "tokenize",
                "lib/use/generate.py": None, "lib/use/serve.py": None}
# Code that training runs: the model, the loss, the data pipeline, the per-epoch validation score.
TRAINING = ["transformer/model.py", "transformer/attention.py", "transformer/loss.py", "transformer/greedy.py",
            "lib/data/pairs.py", "lib/data/tokenizer.py", "lib/model/translate.py", "lib/model/losses.py",
            "lib/tasks/base.py", "lib/tasks/cumsum.py", "lib/train/seq2seq.py", "lib/train/averaging.py"]


def check_a_new_task_reruns_no_other_tasks_stage(repo, env):
    """docs/adding-a-task.md's task module added, and the one command its guide gives after it (the deps tool):
    every cumsum stage stays up to date, and only the index, which lists every task, is stale. Both are put back."""
    import re
    import sys

    guide = (ROOT / "docs" / "adding-a-task.md").read_text()
    [module] = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    task, dvc_yaml = repo / "lib" / "tasks" / "reverse.py", (repo / "dvc.yaml").read_text()
    task.write_text(module)
    try:
        assert "python -m tools.deps" in guide
        sh(sys.executable, "-m", "tools.deps", cwd=repo, env=env)
        status = json.loads(sh(DVC, "status", "--json", cwd=repo, env=env))
        assert set(status) == {"index"}, status
    finally:
        task.unlink()
        (repo / "dvc.yaml").write_text(dvc_yaml)


def changed_deps(repo, env, files: list[str]) -> dict[str, set[str]]:
    """``dvc status`` after a comment is added to each of ``files``: per stale stage, its changed deps. The files
    are put back afterwards."""
    kept = {name: (repo / name).read_text() for name in files}
    try:
        for name, text in kept.items():
            (repo / name).write_text(text + "\n# an edit\n")
        status = json.loads(sh(DVC, "status", "--json", cwd=repo, env=env))
    finally:
        for name, text in kept.items():
            (repo / name).write_text(text)
    return {stage: {dep for entry in entries if isinstance(entry, dict) for dep in entry.get("changed deps", {})}
            for stage, entries in status.items()}


def check_edits_rerun_only_the_stages_that_run_them(repo, env):
    """Editing beam search, a report figure or other code training never runs leaves train@cumsum up to date
    (and makes the stage that runs it stale); editing the model, the loss, the data or the validation score
    makes it stale."""
    def covered(name: str, deps: set[str]) -> bool:  # a dep is a file or a folder
        return any(name == dep or name.startswith(dep + "/") for dep in deps)

    stale = changed_deps(repo, env, list(NOT_TRAINING))
    assert "train@cumsum" not in stale, stale
    for name, stage in NOT_TRAINING.items():
        if stage:
            assert covered(name, stale.get(f"{stage}@cumsum", set())), (name, stale)
        else:
            assert not any(covered(name, deps) for deps in stale.values()), (name, stale)
    stale = changed_deps(repo, env, TRAINING)
    assert [name for name in TRAINING if not covered(name, stale.get("train@cumsum", set()))] == []


@pytest.mark.parametrize("task", ["cumsum", "multi30k", "shakespeare", "wmt14"])
def test_a_checkpoint_is_tied_to_exactly_the_code_dvc_reruns_training_for(task):
    """Resume refuses a checkpoint when training's code changed (training_code's fingerprint); DVC reruns
    train when its deps change. The two must agree: a file in the fingerprint only would throw away an
    interrupted run's progress for an edit to, say, the report's plots; a dep only would resume a model
    trained by other code. dvc.yaml's foreach gives every task the same deps, so a dep the fingerprint lacks
    must be one that another task's module runs."""
    from lib.tasks import task_names
    from lib.train.identity import training_code

    def code(name: str) -> set[str]:
        return {path.relative_to(ROOT).as_posix() for path in training_code(name)}

    deps = {dep.replace("${item}", task) for dep in
            yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["train"]["do"]["deps"]
            if dep.startswith(("lib/", "stages/", "transformer/"))}
    others = set().union(*(code(name) - {f"lib/tasks/{name}.py"} for name in task_names() if name != task))
    assert code(task) <= deps and deps - code(task) <= others
