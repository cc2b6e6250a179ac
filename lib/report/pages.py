"""The report's HTML pages: reports/<task>/report.html (report.md as a page, plus the interactive attention
view), reports/<task>/card.html (the task's headline) and reports/index.html (every task's card).

Every page is self-contained: its style and scripts are inline, its figures local files beside it; it makes
no network request, so it reads the same offline.
"""

import html
import json
import re
from fnmatch import fnmatch
from pathlib import Path

import markdown
import pandas as pd

from lib.core.config import flatten

STATIC = Path(__file__).parent / "static"  # the pages' hand-written style and script
DATA_FILES = ("static/page.css", "static/attention.js")  # read as the pages are written (lib.core.imports)


def page(title: str, body: str, script: str = "") -> str:
    """A whole HTML page: ``body`` (HTML) under the project's style, ``script`` (JavaScript) inline after it."""
    style = (STATIC / "page.css").read_text()
    tail = f"<script>\n{script}\n</script>\n" if script else ""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<link rel="icon" href="data:,">\n'  # no favicon request
            f"<title>{html.escape(title)}</title>\n<style>\n{style}</style>\n</head>\n<body>\n{body}\n{tail}"
            "</body>\n</html>\n")


def markdown_html(text: str) -> str:
    """report.md's Markdown (pipe tables, code blocks) as HTML. Raw HTML in it stays text: Markdown would pass
    it through as markup, and the report quotes data and model outputs (``literal``)."""
    converter = markdown.Markdown(extensions=["tables", "fenced_code"], output_format="html")
    converter.preprocessors.deregister("html_block")
    converter.inlinePatterns.deregister("html")
    return converter.convert(text)


MARKDOWN_MARKS = re.compile(r"([\\`*_\[\]|])")  # what starts emphasis, code, a link, or ends a table cell


def literal(text) -> str:
    """A data or model string (a source, a reference, an output) as Markdown that shows it as written: & < >
    as HTML's entities, Markdown's inline marks and | backslash-escaped. Nothing in it becomes markup, a link
    or a table cell's border."""
    return MARKDOWN_MARKS.sub(r"\\\1", html.escape(str(text), quote=False))


def literal_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell ``literal``, for ``to_markdown``."""
    return frame.map(lambda value: literal(value) if isinstance(value, str) else value)


def code_block(text: str) -> list[str]:
    """``text`` as a fenced code block (shown as written), its fence longer than any run of backticks inside."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return [fence, text, fence]


def json_script(element_id: str, data) -> str:
    """``data`` as a JSON island the page's script reads; ``</`` escaped so that no string in it ends the tag."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def headline(patterns: tuple[str, ...], metrics: dict) -> dict[str, float | int | str]:
    """The metrics a task names in ``headline`` (dotted keys of metrics.json; ``*`` matches any beam width)."""
    flat = flatten(metrics)
    return {key: value for pattern in patterns for key, value in flat.items() if fnmatch(key, pattern)}


def shown_value(value) -> str:
    """A metric as a table shows it: a float to four places, anything else as it is."""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def card_html(task: str, summary: str, metrics: dict[str, float | int | str]) -> str:
    """card.html: the task's headline metrics and its model in a line, for reports/index.html to show."""
    rows = "".join(f"<tr><td>{html.escape(key)}</td><td class=num>{html.escape(shown_value(value))}</td></tr>"
                   for key, value in metrics.items())
    body = (f'<main class="card"><h2><a href="report.html" target="_top">{html.escape(task)}</a></h2>\n'
            f"<p>{html.escape(summary)}</p>\n<table>{rows}</table></main>")
    return page(f"{task}: headline", body)


COMPARE_LINK = ('\n<p>Runs side by side: <a href="compare/index.html">compare/index.html</a>, written by '
                '<code>python -m lib.use.compare</code>: what a run changed, what it bought, and whether the '
                "difference is real.</p>")


def index_html(tasks: list[str], descriptions: dict[str, str]) -> str:
    """reports/index.html: a section per task, with its card (a frame: each task's report stage writes its own,
    so the index is never staler than the reports it shows) and links to its pages."""
    sections = []
    for task in tasks:
        name = html.escape(task)
        sections.append(
            f'<section class="task" id="{name}"><h2>{name}</h2><p>{html.escape(descriptions[task])}</p>\n'
            f'<p><a href="{name}/report.html">report.html</a> (interactive) · <a href="{name}/report.md">'
            f'report.md</a></p>\n<iframe class="card" src="{name}/card.html" title="{name}: headline metrics">'
            "</iframe></section>")
    body = ("<main><h1>Reports</h1>\n<p>One section per task in <code>params.yaml: tasks</code>; each card shows "
            "what the task's last <code>dvc repro</code> measured (a task not built yet shows none).</p>\n"
            + "\n".join(sections) + COMPARE_LINK + "</main>")
    return page("Reports", body)


VIEW_CONTROLS = "".join(f'<label>{name} <select id="av-{key}"></select></label>' for key, name in
                        (("example", "Example"), ("kind", "Attention"), ("layer", "Layer"), ("head", "Head")))


HOW_TO_READ = ("Click or hover a token at the left of a matrix (a position reading) to see what it reads, or one "
               "above it (a token read) to see what reads it. In cross-attention a row is an output token and its "
               "weights over the source are its alignment.")


def attention_view(intro: str, view: dict | None = None) -> str:
    """The interactive attention view: its controls and the places the script draws into; with ``view``, its
    data as the JSON island the script reads (the app gives it each reply's instead)."""
    return (f'<section id="attention-view"><h2>Attention, explored</h2>\n<p>{intro} {HOW_TO_READ}</p>\n'
            f'<div class="controls">{VIEW_CONTROLS}</div>\n<pre id="av-text"></pre>\n<p class="legend" id="av-axes">'
            '</p>\n<p class="readout" id="av-readout"></p>\n<div class="heads" id="av-heads"></div>\n'
            + (json_script("attention-data", view) if view is not None else "") + "</section>")


def attention_section(view: dict) -> str:
    """The report's attention view, over its examples."""
    return attention_view(f"{len(view['examples'])} examples, every kind of attention, layer and head, weights "
                          "rounded to hundredths.", view)


def report_html(title: str, before: str, after: str, view: dict) -> str:
    """report.html: report.md's Markdown ``before`` and ``after`` the attention view."""
    body = f"<main>\n{markdown_html(before)}\n{attention_section(view)}\n{markdown_html(after)}\n</main>"
    return page(title, body, (STATIC / "attention.js").read_text())


def metric_name(name: str) -> str:
    """A metric's key as a sentence names it: bleu -> BLEU, exact_match -> exact match."""
    return "BLEU" if name == "bleu" else name.replace("_", " ")
