"""tools/deps.py: dvc.yaml's deps on the project's code are what each stage imports, file by file."""

import difflib
import shutil

import pytest

from tests.conftest import ROOT
from tools import deps


def test_dvc_yaml_lists_what_each_stage_runs():
    assert deps.drift(ROOT / "dvc.yaml") == {}


@pytest.fixture
def copy(tmp_path):
    for name in ("lib", "stages", "transformer"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    return tmp_path


def test_an_import_dvc_yaml_lacks_fails_the_check_until_written(copy, capsys):
    steps = copy / "lib" / "train" / "steps.py"
    steps.write_text(steps.read_text() + "\nfrom lib.evaluate import by_length  # noqa\n")
    assert deps.drift(copy / "dvc.yaml") == {"train": (["lib/evaluate/__init__.py", "lib/evaluate/by_length.py"], [])}
    with pytest.raises(SystemExit) as stop:
        deps.main(["--check", "--dvc-yaml", str(copy / "dvc.yaml")])
    assert "1 stage(s) out of date; run `python -m tools.deps`" in str(stop.value.code)
    assert capsys.readouterr().out == ("train: runs lib/evaluate/__init__.py, which its deps do not list\n"
                                       "train: runs lib/evaluate/by_length.py, which its deps do not list\n")
    unchanged = (copy / "dvc.yaml").read_text()
    assert unchanged == (ROOT / "dvc.yaml").read_text()  # --check writes nothing

    deps.main(["--dvc-yaml", str(copy / "dvc.yaml")])
    assert deps.drift(copy / "dvc.yaml") == {}
    added = [line for line in difflib.ndiff(unchanged.splitlines(), (copy / "dvc.yaml").read_text().splitlines())
             if line[:1] in "+-"]
    assert added == ["+         - lib/evaluate/__init__.py", "+         - lib/evaluate/by_length.py"]  # train's


def test_a_file_dropped_from_an_import_leaves_the_deps_of_the_stages_that_ran_it(copy):
    """A file no stage imports any more is named as listed but not run (a stale dep reruns stages for nothing)."""
    script = copy / "stages" / "index.py"
    script.write_text(script.read_text().replace("from lib.report.pages import index_html\n", "")
                      .replace("index_html(tasks, descriptions)", "str(descriptions)"))
    missing, extra = deps.drift(copy / "dvc.yaml")["index"]
    assert missing == [] and "lib/report/pages.py" in extra and "lib/report/static/page.css" in extra
