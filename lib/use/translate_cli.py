"""The command line's translation (lib.use.generate, a seq2seq model): a file line by line, or lines as they are
typed; n-best tables and given outputs scored; the attention drawn."""

import argparse
import csv
import io
import sys
from pathlib import Path

from lib.core.text import utf8_text
from lib.use.attention_figures import draw_translation_attention, write_figures
from lib.use.command import N_BEST_COLUMNS, SCORE_COLUMNS
from lib.use.lines import Written, outputs_of, score_lines, translate_lines
from lib.use.textio import read_lines, write_text


def outputs_table(tokenizers, written: Written, columns: tuple[str, ...], header: bool = True) -> str:
    """Tab-separated, with a header: for each translated line (numbered from 1) its outputs, best first.
    log_prob is the model's log-probability of the output (natural log), eos included when the output
    ended with one (eos false: it was cut at its length limit); score is what beam search ranks by,
    log_prob / ((5 + tokens) / 6) ** alpha, where tokens counts the eos too; least_likely (given outputs
    only) is the token the model found least likely there, with its log-probability. A field holding a tab, a
    newline or a double quote is quoted, as CSV does, so that ``pandas.read_csv(sep="\\t")`` reads it."""
    table = io.StringIO()
    writer = csv.writer(table, delimiter="\t", lineterminator="\n")
    if header:
        writer.writerow(columns)
    for i in sorted(written):
        for rank, out in enumerate(outputs_of(tokenizers.target, written[i][1]), start=1):
            row = {"line": i + 1, "rank": rank, "score": f"{out.score:.4f}", "log_prob": f"{out.log_prob:.4f}",
                   "tokens": out.tokens, "eos": str(out.eos).lower(), "translation": out.text,
                   "least_likely": f"{out.least_likely[0]} {out.least_likely[1]:.2f}" if out.least_likely else ""}
            writer.writerow([row[column] for column in columns])
    return table.getvalue()


def translate_file(args: argparse.Namespace, model, tokenizers):
    """Translate --input, or score --score beside it; write the outputs, or their table, to --output."""
    lines = read_lines(args.input)
    if args.score:
        if len(outputs := read_lines(args.score)) != len(lines):
            raise ValueError(f"--score has {len(outputs)} lines but --input has {len(lines)}: they must be "
                             "parallel, one output per source line")
        translations, messages, written = score_lines(model, tokenizers, lines, outputs, args.alpha, args.max_tokens,
                                                      what="the --score output")
    else:
        translations, messages, written = translate_lines(model, tokenizers, lines, args.beam_size, args.alpha,
                                                          args.max_extra_tokens, args.max_tokens, args.n_best or 1)
    for message in messages:
        print(f"generate: {message}", file=sys.stderr)
    finish(args, model, tokenizers, lines, translations, written)


def finish(args: argparse.Namespace, model, tokenizers, lines: list[str], translations: list[str], written: Written,
           output: bool = True):
    """Draw the attention (--attention) and write --output (unless not ``output``): the translations, or
    their table."""
    if args.attention:
        write_figures(Path(args.attention), lambda figures: draw_translation_attention(
            model, tokenizers, lines, translations, written, figures))
    if not output:
        return
    if args.score or args.n_best:
        write_text(args.output, outputs_table(tokenizers, written, SCORE_COLUMNS if args.score else N_BEST_COLUMNS))
    else:
        write_text(args.output, "".join(t + "\n" for t in translations))


def typed(args: argparse.Namespace) -> bool:
    """Whether the lines to translate are typed at a terminal (--input -, no --score)."""
    return args.input == "-" and not args.score and sys.stdin.isatty()


def translate_typed(args: argparse.Namespace, model, tokenizers):
    """--input - from a terminal: each line translated as it is entered, and shown at once (its table rows
    with --n-best), until the end of input (Ctrl-D); then --attention and an --output file, as for a file."""
    print("generate: translating each line as you enter it; Ctrl-D to end", file=sys.stderr)
    shown = args.output == "-"
    if shown and args.n_best:
        write_text("-", outputs_table(tokenizers, {}, N_BEST_COLUMNS))  # the header
    lines, translations, written = [], [], {}
    for raw in iter(sys.stdin.buffer.readline, b""):
        number = len(lines) + 1
        line = utf8_text(raw, "stdin", first_line=number)
        (translation,), messages, found = translate_lines(model, tokenizers, [line], args.beam_size, args.alpha,
                                                          args.max_extra_tokens, args.max_tokens, args.n_best or 1,
                                                          lambda _: f"line {number}")
        for message in messages:
            print(f"generate: {message}", file=sys.stderr)
        this = {number - 1: found[0]} if found else {}  # by line index, as translate_file has it
        lines.append(line.rstrip("\r\n"))
        translations.append(translation)
        written |= this
        if shown:
            write_text("-", outputs_table(tokenizers, this, N_BEST_COLUMNS, header=False) if args.n_best
                       else translation + "\n")
    finish(args, model, tokenizers, lines, translations, written, output=not shown)  # shown: line by line
