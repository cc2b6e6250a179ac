"""report.html and reports/index.html in a real browser (headless Chromium, through Playwright): no error, no
request leaving the page, a clicked token shows its own row of the model's attention; and the index stage."""

import io
import os
import shutil

import matplotlib.image
import pandas as pd
import pytest
import yaml

from lib.model import checkpoint
from lib.report.attention_view import chosen_examples
from lib.report.families import REPORTING
from lib.data.pairs import collate
from lib.report.attention_maps import attention_maps
from lib.report import reporting
from lib.report.reporting import ReportPaths, read_samples
from lib.tasks.params import stage_config
from lib.data.tokenizer import encode_pairs, special_ids
from tests.conftest import TINY_PARAMS, run_stage
from tests.test_stages import built, last_line  # noqa: F401 (built: the tiny cumsum pipeline, a fixture)

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        message = "no Chromium on this machine: apt-get install chromium (.ci/run installs it)"
        if os.environ.get("CI"):  # CI installs it: there, a missing browser is a failure, never a skip
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


class Visit:
    """A page opened in the browser, with what it logged as an error and every URL it requested."""

    def __init__(self, browser, where):
        """``where``: a file, or a URL."""
        self.page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.errors, self.requests = [], []
        self.page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.goto(where if isinstance(where, str) else where.as_uri())


def picked_weights(page) -> list[int]:
    """The hundredths the view marks in its first matrix: a row's or a column's."""
    return [int(cell) for cell in page.locator("#av-heads table").first.locator("td.w.picked, tr.picked td.w")
            .evaluate_all("cells => cells.map(cell => cell.dataset.weight)")]


@pytest.mark.slow  # a real browser
def test_the_report_page_works_offline_and_a_clicked_token_shows_its_row(browser, built):
    report_dir = built["report"].parent
    visit = Visit(browser, report_dir / "report.html")
    page = visit.page
    page.select_option("#av-kind", "cross")
    page.select_option("#av-layer", "0")
    page.select_option("#av-head", "1")
    example = chosen_examples(read_samples(built["samples"], REPORTING["seq2seq"].sample_keys)).iloc[0]
    assert page.locator("#av-example option").first.text_content().endswith(example.source)

    # The model's own cross-attention for that example, teacher-forced on its greedy output: layer 1, head 2
    model, tokenizers, _ = checkpoint.load_trained(built["model"], built["tokenizer"], task="cumsum")
    ids = special_ids(tokenizers)
    pairs = encode_pairs(tokenizers, pd.DataFrame({"src": [example.source], "tgt": [example.greedy]}))
    maps, _ = attention_maps(model, collate(pairs, [0], ids), ids)
    S, T = len(pairs.src[0]), len(pairs.tgt[0]) + 1
    expected = (maps["cross-attention"][0][0, 1, :T, :S] * 100).round().int()

    for row in (2, 0, T - 1):
        page.locator("#av-heads table").first.locator(f'tbody th[data-index="{row}"]').click()
        page.mouse.move(0, 0)  # the pointer off the token: the click's row stays
        assert picked_weights(page) == expected[row].tolist(), row
    page.locator("#av-heads table").first.locator('thead th[data-index="1"]').click()
    page.mouse.move(0, 0)
    assert picked_weights(page) == expected[:, 1].tolist()
    assert page.locator("#av-readout").text_content().startswith(
        f"{tokenizers.source.id_to_token(pairs.src[0][1])} (source 2) is read by: head 2: ")
    page.select_option("#av-head", "all")
    assert page.locator("#av-heads table").count() == TINY_PARAMS["cumsum"]["train"]["model"]["n_heads"]

    pixels = matplotlib.image.imread(io.BytesIO(page.screenshot(full_page=True)))
    assert pixels.std() > 0.05, "the screenshot is blank"
    assert visit.errors == []
    assert all(url.startswith(report_dir.as_uri()) for url in visit.requests), visit.requests
    assert any(url.endswith("/figures/loss.png") for url in visit.requests)  # its figures: local files
    page.close()


# A sample whose source and output hold markup, script, a link, Markdown and a table's | (cumsum's reference
# stays its numbers: the report reads them as the values summed)
HOSTILE = {"source": "<script>window.pwned = 1</script> 3 | 4",
           "greedy": '<img src=x onerror="window.pwned = 2"> **3** [x](javascript:window.pwned=3) <eos> &amp; `7` '
                     "\\ _8_"}


@pytest.mark.slow  # a real browser
def test_text_from_the_data_and_the_model_stays_text(browser, built, tmp_path):
    """report.html built from that sample shows each string as written, each in its own cell (source, reference,
    greedy), and runs no script; the report's own words about <eos> and <bos> show them too."""
    samples = read_samples(built["samples"], REPORTING["seq2seq"].sample_keys)
    first = samples.index[samples["first"]][0]
    for column, text in HOSTILE.items():
        samples.loc[first, column] = text
    samples.loc[first, "correct"] = False
    samples.to_json(tmp_path / "samples.jsonl", orient="records", lines=True, force_ascii=False)
    out = tmp_path / "report.md"
    reporting.run("cumsum", stage_config(TINY_PARAMS, "cumsum", "report"), ReportPaths(
        data=built["data"], tokenizer=built["tokenizer"], model=built["model"], metrics=built["metrics"],
        samples=tmp_path / "samples.jsonl", lengths=built["lengths"], live=built["live"], out=out,
        figures=tmp_path / "figures", losses=tmp_path / "losses.csv"))
    visit = Visit(browser, tmp_path / "report.html")
    page = visit.page
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.locator("img[src='x'], a[href^='javascript'], strong, em").count() == 0
    row = page.locator("h2:text-is('First test examples') + table tbody tr").first
    cells = row.locator("td").all_text_contents()
    assert [cells[0], cells[2]] == list(HOSTILE.values())
    assert "the source's <eos> (decoder self-attention: <bos>)" in page.inner_text("body")
    assert visit.errors == []
    page.close()


@pytest.mark.slow  # a real browser
def test_the_index_frames_each_tasks_card(browser, built, tmp_path):
    reports = built["report"].parents[1]
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(TINY_PARAMS))
    assert run_stage("index", ["--params", str(params), "--out", str(reports / "index.html")]) == 0
    visit = Visit(browser, reports / "index.html")
    card = visit.page.frame_locator("iframe.card").first
    assert card.locator("td", has_text="greedy.exact_match").count() == 1
    assert visit.page.locator('a[href="cumsum/report.html"]').count() == 1
    assert visit.errors == [] and all(url.startswith(reports.as_uri()) for url in visit.requests)
    visit.page.close()


@pytest.mark.parametrize("tasks, said", [
    ([], "tasks: empty, so `dvc repro` builds nothing; list a task or more (tasks: [cumsum])"),
    (["cumsum", "multi30K"], "tasks: unknown task 'multi30K' (known: cumsum, multi30k, shakespeare, wmt14)"),
    (["cumsum", "cumsum"], "tasks: ['cumsum', 'cumsum'] names a task twice"),
])
def test_the_index_stage_names_a_task_list_that_builds_nothing_or_a_misspelt_task(tmp_path, capsys, tasks, said):
    """The first stage `dvc repro` runs: `tasks: []` did nothing, silently; a misspelt task failed inside DVC."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({**TINY_PARAMS, "tasks": tasks}))
    assert run_stage("index", ["--params", str(params), "--out", str(tmp_path / "index.html")]) == 2
    assert last_line(capsys.readouterr().err) == f"index: error: {said}"
    assert not (tmp_path / "index.html").exists()


def test_head_statistics_read_a_head_that_looks_at_itself_and_one_at_the_previous_token():
    """Per head: mean entropy, weight on the same position, on the previous one, and on the sink."""
    import torch

    from lib.report.attention_view import head_statistics

    eye = torch.eye(4)
    previous = torch.zeros(4, 4)
    previous[0, 0] = 1.0  # the first position has no previous one: it reads itself
    previous[torch.arange(1, 4), torch.arange(0, 3)] = 1.0
    uniform = torch.full((4, 4), 0.25)
    weights = torch.stack([eye, previous, uniform])[None]  # (B=1, H=3, 4, 4)
    stats = head_statistics(weights, rows=torch.tensor([3]), sink=torch.tensor([0]))  # the 4th row is padding
    assert stats["rows"] == 3
    mean = {name: (stats[name] / stats["rows"]).tolist() for name in ("entropy", "same", "previous", "sink")}
    assert mean["same"] == pytest.approx([1.0, 1 / 3, 0.25])
    assert mean["previous"] == pytest.approx([0.0, 2 / 3, 0.25 * 2 / 3])
    assert mean["sink"] == pytest.approx([1 / 3, 2 / 3, 0.25])
    assert mean["entropy"] == pytest.approx([0.0, 0.0, torch.log(torch.tensor(4.0)).item()], abs=1e-6)


def test_cumsum_accuracy_by_target_value_counts_each_value_in_training():
    from lib.report.length_study import accuracy_by_value

    samples = pd.DataFrame({"split": ["test", "test", "lengths"], "reference": ["1 3 8", "2 3", "9 9"],
                            "greedy": ["1 3 7", "2", "9 9"]})
    train = pd.DataFrame({"src": ["1 2", "3"], "tgt": ["1 3", "3"]})
    table = accuracy_by_value(samples, train)
    assert table.to_dict("list") == {"value": [1, 2, 3, 8], "tokens": [1, 1, 2, 1], "accuracy": [1.0, 1.0, 0.5, 0.0],
                                     "train_count": [1, 0, 2, 0]}


def test_the_worst_examples_are_only_wrong_ones(built):
    """The table listed the wrong outputs, then correct ones repeating the first examples'."""
    text = built["report"].read_text()
    rows = text.split("## Worst test examples")[1].split("\n## ")[0].strip().splitlines()
    wrong = [row for row in rows[2:] if row.startswith("|")]
    assert rows[0].startswith("| source") and all(row.rstrip(" |").endswith("False") for row in wrong)
    samples = read_samples(built["samples"], REPORTING["seq2seq"].sample_keys)
    assert len(wrong) == (samples["worst"] & ~samples["correct"]).sum()
