"""generate's --attention DIR: the attention that wrote each output, drawn (matplotlib, imported only when
asked) into DIR beside a page that shows them, the directory replaced figure by figure, never half-drawn."""

import os
import tempfile
from fnmatch import fnmatchcase
from pathlib import Path

from tqdm import tqdm

from lib.data.pairs import Pairs, collate
from lib.use.language_model import LanguageModel
from lib.use.lines import Written
from lib.data.tokenizer import special_ids
from lib.report.attention_maps import attention_maps, visible


ATTENTION_BATCH = 32  # lines drawn per forward pass


LM_ATTENTION_TOKENS = 64  # the LM's drawing covers the text's first tokens: a wider grid is unreadable


def draw_translation_attention(model, tokenizers, lines: list[str], translations: list[str],
                               written: Written, figures: Path) -> list[str]:
    """For each translated line, the attention that wrote its output (encoder self, decoder self and
    cross, every layer and head), with the model teacher-forced on that output: each decoder row is the
    step that chose the token it is labelled with. Figures go to ``figures``; returns the page's lines."""
    from lib.report.figures import pair_heatmaps  # matplotlib, only when asked

    ids = special_ids(tokenizers)
    device = next(model.parameters()).device
    numbers = sorted(written)
    page = ["# Attention", "",
            "For each line, one panel per layer (rows) and head (columns). Decoder rows are the steps of the "
            "output, labelled by the token each chose (with --score, the token given); columns are the tokens it "
            "reads.", ""]
    # disable=None: a bar at a terminal only, never frames in a log
    with tqdm(total=len(numbers), desc="drawing attention", unit="line", leave=False, disable=None) as progress:
        for first in range(0, len(numbers), ATTENTION_BATCH):
            chunk = numbers[first:first + ATTENTION_BATCH]
            pairs = Pairs([written[n][0] for n in chunk], [written[n][1][0].tokens for n in chunk])  # the best output
            batch = collate(pairs, list(range(len(chunk))), ids).to(device)
            maps, _ = attention_maps(model, batch, ids)
            maps = {kind: [w.float().cpu() for w in layers] for kind, layers in maps.items()}
            for i, n in enumerate(chunk):
                page += [f"## Line {n + 1}", "", f"- source: `{lines[n].strip()}`",
                         f"- output: `{translations[n]}`", ""]
                page += pair_heatmaps(maps, batch, pairs, i, tokenizers, f"line {n + 1}", f"line{n + 1}", figures,
                                      Path("."))
                progress.update()
    return page


def draw_lm_attention(lm: LanguageModel, tokens: list[int], figures: Path, what: str) -> list[str]:
    """The self-attention over the first tokens of ``what`` (the prompt and its continuation, a scored
    text): ``LM_ATTENTION_TOKENS``, or the model's training block if that is shorter."""
    from lib.report.figures import plot_attention_grid  # matplotlib, only when asked

    shown = lm.attention(tokens[:LM_ATTENTION_TOKENS])["self-attention"]
    labels = [visible(token) for token in shown.rows]
    plot_attention_grid(shown.layers, labels, labels, f"Self-attention over the first {len(labels)} tokens",
                        figures / "self_attention.png")
    return ["# Attention", "",
            f"The first {len(labels)} tokens of {what}. Rows: the position predicting "
            "the next token; columns: the positions it reads. One panel per layer (rows) and head (columns).", "",
            "![self-attention](self_attention.png)", ""]


# The names write_figures puts in --attention (fnmatch patterns): an --output there by one of them would replace it.
FIGURE_FILES = ("attention.md", "self_attention.png", "*_attention_line*.png")


def write_figures(out_dir: Path, draw):
    """``draw(figures)`` writes PNGs into a temporary directory beside ``out_dir`` and returns the lines of
    attention.md; every file then moves into ``out_dir`` (created if need be), so an error or Ctrl-C leaves
    no half-drawn figure. An earlier run's figures that this one did not draw (it had more lines, or the
    other kind of model) go, so that the directory shows one run; files by other names are left alone."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp:
        figures = Path(tmp)
        (figures / "attention.md").write_text("\n".join(draw(figures)), encoding="utf-8")
        out_dir.mkdir(exist_ok=True)
        drawn = sorted(path.name for path in figures.iterdir())
        for name in drawn:
            os.replace(figures / name, out_dir / name)
    for path in sorted(out_dir.iterdir()):
        if path.name not in drawn and not path.is_dir() and is_a_figure(path.name):
            path.unlink()


def is_a_figure(name: str) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in FIGURE_FILES)

