"""Comparing runs (python -m lib.use.compare) and studies (python -m lib.use.study). The page of an experiment
against its committed baseline, and a study of three rows through DVC's queue, are checked inside
tests/test_pipeline.py's `dvc repro` end to end, on its repository; here, a study's mistakes named before
anything is queued, and the paired bootstrap against sacreBLEU's own."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from lib.core.config import ConfigError
from lib.core.text import load_params
from lib.tasks import get_task
from lib.use import compare, significance
from lib.use import study
from lib.use.study import check_rows, load_study, option, queue_command
from tests.conftest import ROOT, TINY_PARAMS, sh
from tests.test_report_page import CHROMIUM, Visit

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def python(*args, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)


def table_rows(text: str) -> dict[str, list[str]]:
    """A Markdown page's table rows by their first cell, each as its cells."""
    return {cells[0]: cells for line in text.splitlines() if line.startswith("| ")
            for cells in [[cell.strip() for cell in line.strip("|").split("|")]]}


def check_the_comparison_page(repo, env, tmp_path, name: str, change: str):
    """Run by tests/test_pipeline.py's `dvc repro` end to end, once the README's `python -m lib.use.compare HEAD
    <name>` has written the page for its committed baseline (epochs 2) and the README's experiment ``name``,
    whose one ``change`` (`cumsum.train.epochs`: 2 -> 1) the page lists and no other param. It has the
    exact-match difference with a p-value and an interval, the curves overlaid; a browser shows it whole; and
    a clone without the DVC cache still shows the params and metrics, naming the command for the rest."""
    text = (repo / "reports/compare/index.md").read_text()
    changed = text.split("Params that differ:")[1].split("|")[0]
    assert [line for line in changed.splitlines() if line.startswith("- ")] == [f"- {change}"]
    metrics = table_rows(text)
    exact = metrics["greedy.exact\\_match"]
    head = json.loads(sh("git", "show", "HEAD:reports/cumsum/metrics.json", cwd=repo, env=env))
    ran = json.loads((repo / "reports/cumsum/metrics.json").read_text())  # the experiment ran in the workspace
    assert float(exact[1]) == pytest.approx(head["greedy"]["exact_match"], abs=1e-4)
    assert float(exact[2]) == pytest.approx(ran["greedy"]["exact_match"], abs=1e-4)
    assert 0 < float(exact[5].split()[0]) <= 1 and exact[4].startswith("\\[")  # a p-value and an interval
    assert 0 < float(metrics["loss"][5].split()[0]) <= 1  # the test loss, tested over sentences too
    speed = pd.read_csv(repo / "reports/cumsum/train/plots/metrics/train/tokens_per_s.tsv", sep="\t")
    assert float(metrics["tokens\\_per\\_s"][2]) == pytest.approx(speed["tokens_per_s"].median(), rel=1e-3)
    for figure in ("cumsum-loss.png", "cumsum-exact_match-by-epoch.png", "cumsum-exact_match-by-minutes.png"):
        assert f"](figures/{figure})" in text and (repo / "reports/compare/figures" / figure).is_file()
    assert 'href="compare/index.html"' in (repo / "reports/index.html").read_text()  # the index links it
    if CHROMIUM is not None:
        check_in_a_browser(repo / "reports/compare")
    elif os.environ.get("CI"):  # CI installs it: there, a missing browser is a failure, never a skip
        pytest.fail("no Chromium on this machine: apt-get install chromium (.ci/run installs it)")

    clone = tmp_path / "clone-compare"
    sh("git", "clone", "-q", str(repo), str(clone), cwd=tmp_path, env=env)
    sh("git", "fetch", "-q", "origin", "refs/exps/*:refs/exps/*", cwd=clone, env=env)
    compare.main(["HEAD", name, "--repo", str(clone), "--out", str(clone / "reports/compare")])
    text = (clone / "reports/compare/index.md").read_text()
    assert f"- {change}" in text and "| greedy.exact\\_match" in text  # from git, all the same
    assert "samples.jsonl is not in the local cache" in text and "dvc exp pull" in text  # and how to get the rest


def check_in_a_browser(page_dir):
    """The page in headless Chromium: the changed param, the intervals, every figure drawn, nothing fetched
    from elsewhere, no error."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        visit = Visit(chromium, page_dir / "index.html")
        page = visit.page
        assert page.locator("li code", has_text="cumsum.train.epochs").count() == 1
        assert page.locator("th", has_text="95% interval").count() == 1
        images = page.locator("img")
        assert images.count() == 3 and all(images.nth(i).evaluate("image => image.naturalWidth > 0")
                                           for i in range(images.count()))
        assert visit.errors == [] and all(url.startswith(page_dir.as_uri()) for url in visit.requests)
        chromium.close()


def check_a_study_runs_through_the_queue(repo, env):
    """Run by tests/test_pipeline.py's `dvc repro` end to end, after the README's experiment (epochs 1): a study
    of three cumsum rows at one epoch, queued by python -m lib.use.study and run by DVC's queue; its table has
    the study's columns, each row's params, and each row's test against the first. (Row h2 is the README's
    experiment again: DVC's run cache gives its outputs without training.)"""
    declared = {"description": "heads at one epoch", "task": "cumsum", "set": {"cumsum.train.epochs": 1},
                # h4 also sets d_head, a key the tiny params leave to its default: queued with DVC's +key=value
                "rows": {"h2": {}, "h1": {"cumsum.train.model.n_heads": 1},
                         "h4": {"cumsum.train.model.n_heads": 4, "cumsum.train.model.d_head": 4}},
                "columns": {"h": "params.train.model.n_heads",
                            "d_k": {"key": "params.train.model.d_model", "per": "params.train.model.n_heads"},
                            "exact match": "metrics.greedy.exact_match", "steps": "metrics.steps",
                            "params (K)": {"key": "metrics.parameters", "scale": 0.001, "digits": 1}}}
    (repo / "studies").mkdir()
    (repo / "studies/heads.yaml").write_text(yaml.safe_dump(declared, sort_keys=False))
    queued = python("-m", "lib.use.study", "studies/heads.yaml", "--run", cwd=repo, env=env)
    assert queued.returncode == 0, queued.stdout + queued.stderr
    assert "dvc exp run --queue -n heads-h1 -S cumsum.train.epochs=1 -S cumsum.train.model.n_heads=1" in queued.stdout
    assert "-S cumsum.train.model.n_heads=4 -S +cumsum.train.model.d_head=4" in queued.stdout
    compare.main(["--study", str(repo / "studies/heads.yaml"), "--repo", str(repo), "--out",
                  str(repo / "reports/study")])
    lines = [line for line in (repo / "reports/study/index.md").read_text().splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["row", "h", "d\\_k", "exact match", "steps", "params (K)", "greedy.exact\\_match vs h2", "p"]
    page = (repo / "reports/study/index.md").read_text()
    assert "every row also sets `cumsum.train.epochs`: 1" in page
    assert "- h2: none\n- h1: `cumsum.train.model.n_heads`: 1\n" in page
    assert "- h4: `cumsum.train.model.n_heads`: 4, `cumsum.train.model.d_head`: 4\n" in page
    rows = table_rows("\n".join(lines[1:]))
    assert [rows[row][1:3] for row in ("h2", "h1", "h4")] == [["2", "8"], ["1", "16"], ["4", "4"]]
    assert rows["h2"][-1] == "" and 0 < float(rows["h1"][-1].split()[0]) <= 1
    (repo / "studies/heads.yaml").unlink()
    (repo / "studies").rmdir()


def test_a_study_row_with_a_misspelt_key_is_named_before_anything_is_queued(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump({"task": "cumsum", "rows": {"base": {}, "bad": {"cumsum.train.epohcs": 2}}}))
    with pytest.raises(ConfigError, match=r"typo: rows\.bad: cumsum\.train\.epohcs: unknown key"):
        check_rows(load_study(path), TINY_PARAMS)
    with pytest.raises(SystemExit, match=r"rows\.bad"):
        study.main([str(path), "--params", str(ROOT / "params.yaml")])
    assert "dvc exp run" not in capsys.readouterr().out


def test_a_key_params_yaml_leaves_to_its_default_is_queued_with_a_plus():
    """Table 3's rows B set model.d_head, which params.yaml leaves out (null): DVC's -S changes only a key that
    is there, so the row is queued with +key=value; a key that is there keeps -S key=value."""
    study = load_study(ROOT / "studies" / "table3_multi30k.yaml")
    command = queue_command(study, "B-dk16", load_params(ROOT / "params.yaml"))
    assert "+multi30k.train.model.d_head=16" in command and "multi30k.train.cooldown=0.2" in command


@pytest.mark.parametrize("path", sorted((ROOT / "studies").glob("*.yaml")), ids=lambda path: path.stem)
def test_every_shipped_study_checks_against_the_params(path):
    """Each study in studies/ loads and its rows pass every stage's checks against params.yaml: no drift."""
    study = load_study(path)
    check_rows(study, load_params(ROOT / "params.yaml"))
    assert study.columns and (study.test is None or study.test in get_task(study.task).metric_names())


def test_an_override_is_given_to_dvc_as_yaml():
    assert [option("tasks", ["cumsum"]), option("a.b", True), option("a.c", 0.1), option("a.d", "rope")] == [
        'tasks=["cumsum"]', "a.b=true", "a.c=0.1", "a.d=rope"]


def test_the_paired_bootstrap_gives_sacrebleus_p_values():
    """BLEU and chrF through lib.use.significance give the p-values of sacreBLEU's own PairedTest (bs)."""
    rng = np.random.default_rng(0)
    words = "a dog runs on the grass with a red ball while two men watch".split()
    references = [" ".join(rng.choice(words, 8)) for _ in range(200)]
    base = [" ".join(w if rng.random() > 0.3 else "x" for w in ref.split()) for ref in references]
    new = [" ".join(w if rng.random() > 0.27 else "x" for w in ref.split()) for ref in references]
    _, results = PairedTest([("base", base), ("new", new)], {"BLEU": BLEU(), "chrF": CHRF()}, [references],
                            test_type="bs")()
    bleu, chrf = significance.bleu_test(base, new, references), significance.chrf_test(base, new, references)
    assert bleu.p_value == results["BLEU"][1].p_value and chrf.p_value == results["chrF2"][1].p_value
    assert bleu.new == pytest.approx(results["BLEU"][1].score) and bleu.low < bleu.delta < bleu.high


def test_a_mean_and_a_ratio_are_tested_alike():
    """Equal runs: p is 1 and the interval is [0, 0]; a run right on every example where the other is wrong on
    a third: a real difference."""
    right = np.ones(300)
    same = significance.mean_test(right, right)
    assert (same.p_value, same.low, same.high) == (1.0, 0.0, 0.0)
    worse = np.where(np.arange(300) % 3 == 0, 0.0, 1.0)
    assert significance.mean_test(worse, right).significant()
    loss = significance.ratio_test(np.full(300, 6.0), np.full(300, 3.0), np.full(300, 3.0), np.full(300, 3.0))
    assert (loss.base, loss.new) == (2.0, 1.0) and loss.significant()


def test_runs_on_different_test_sets_are_not_paired():
    frame = pd.DataFrame({"reference": ["1 2", "3"], "greedy": ["1 2", "3"], "correct": [True, True],
                          "score": [1.0, 1.0]})
    other = frame.assign(reference=["1 3", "3"])
    metrics = {"greedy.exact_match": 1.0}
    found, why = compare.tests("cumsum", compare.Built(None, metrics, None, None, frame),
                               compare.Built(None, metrics, None, None, other))
    assert found == {} and "test sets differ" in why


def test_a_run_that_is_no_revision_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no-such-run: neither an experiment"):
        compare.main(["HEAD", "no-such-run", "--repo", str(ROOT), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_the_page_never_replaces_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="notes.txt"):
        compare.main(["HEAD", "HEAD", "--repo", str(ROOT), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"

