"""What a newcomer reads: a README short enough to read in minutes, in plain sentences, and words that hold on
any machine."""

import re
import subprocess

from tests.conftest import ROOT


def prose_sentences(markdown: str) -> list[list[str]]:
    """The sentences of ``markdown``'s prose, as lists of words: code blocks, tables, headings, images and
    link targets left out. A sentence ends at ., ! or ? before a space or the line's end, and at the end
    of its paragraph (a code block, too, ends the text that leads into it)."""
    text = re.sub(r"```.*?```", "\n\n", markdown, flags=re.S)
    sentences = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines()
                 if line.strip() and not line.lstrip().startswith(("|", "#", "!["))]
        prose = re.sub(r"\]\([^)]*\)", "]", " ".join(lines))  # a link's target is no word of the sentence
        sentences += [words for sentence in re.split(r"(?<=[.!?])\s+", prose) if (words := sentence.split())]
    return sentences


def test_the_readme_is_short_and_its_sentences_plain():
    """At most 200 lines, and 25 words a sentence on average: read in minutes, the rest linked."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sentences = prose_sentences(readme)
    mean = sum(map(len, sentences)) / len(sentences)
    assert len(readme.splitlines()) <= 200
    assert mean <= 25, f"{mean:.1f} words a sentence"


def test_every_guide_reads_in_plain_sentences():
    """Each page under docs/ at most 25 words a sentence on average, as the README: a list, not a sentence,
    for many cases."""
    means = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        sentences = prose_sentences(page.read_text(encoding="utf-8"))
        means[page.name] = round(sum(map(len, sentences)) / len(sentences), 1)
    assert len(means) >= 10 and all(mean <= 25 for mean in means.values()), means


def anchor(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_and_the_guides_link_only_what_is_there():
    """Every file they link, and every section: a headline figure leads to the section that measured it. A
    link is relative to its page, as a Markdown viewer follows it."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = 0
    for page in pages:
        for target, section in re.findall(r"\]\(([^)#]*)(?:#([^)]+))?\)", page.read_text(encoding="utf-8")):
            if target.startswith("http"):
                continue
            linked = page.parent / target if target else page  # "#section": a section of the page itself
            assert linked.exists(), f"{page.name}: {target}"
            if section:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.M)
                assert section in map(anchor, headings), f"{page.name}: {target}#{section}"
            checked += 1
    assert checked > 40


def test_no_text_speaks_of_one_teams_machines():
    """Words for anyone who clones it: "an offline copy", not "these machines"."""
    tracked = subprocess.run(["git", "ls-files", "*.md", "*.py", "*.txt", "*.yaml", "Makefile"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"these machines|the team's machines|our machines", re.I)
    found = [f"{name}:{number}" for name in tracked if name != "tests/test_docs.py"
             for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line)]
    assert found == []


# A work log's marks: "the forty-fifth session", "this session", "`status` at 22:07"; an issue's number
# ("#8", "issue 72"; an upstream one, pytorch#126510, names its project and is a reference).
WORK_LOG = re.compile(r"\b\w+(st|nd|rd|th) (and \w+(st|nd|rd|th) )?sessions?\b|\bthis session\b|`status` at \d", re.I)
ISSUE = re.compile(r"(?<![\w/&])#\d+\b|\bissues? #?\d+", re.I)


def test_no_text_reads_as_a_work_log_or_cites_an_issue():
    """No dated entries, sessions counted or issues' numbers: the tree says what holds, with the command
    that shows it."""
    tracked = subprocess.run(["git", "ls-files", "*.md", "*.py", "*.sh", "*.txt", "*.yaml", "Makefile"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    found = [f"{name}:{number}: {line.strip()[:80]}" for name in tracked if name != "tests/test_docs.py"
             for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
             if WORK_LOG.search(line) or ISSUE.search(line)]
    assert found == []
