"""Use a trained model: translate a file line by line, or continue a prompt with the LM.

    python -m lib.use.generate --task multi30k --input FILE --output FILE [--beam-size N] [--alpha A] [--n-best K]
    python -m lib.use.generate --task multi30k --input FILE --score OUTPUTS --output TABLE
    python -m lib.use.generate --task shakespeare --score TEXT
    python -m lib.use.generate --task shakespeare --prompt TEXT --max-new-tokens N --temperature T --top-k K
    python -m lib.use.generate --task shakespeare --prompt -       (stdin; at a terminal, each line typed)
    ... --attention DIR    also draw the attention that wrote each output (DIR/attention.md)

``-`` as --input or --output is stdin or stdout; typed at a terminal, each line is
translated as it is entered. The LM's ``--prompt -`` is the whole of stdin, or, at
a terminal, each line as it is entered; samples go to stdout as they are drawn.
The model and tokenizer come from ``models/<task>/`` (what ``dvc repro`` wrote;
--models DIR for another place). A translation file gets one output line per
input line: an empty line gives an empty line, and a line longer than the model
accepts gets a message on stderr and an empty line, so one bad line never stops
the file. Words or characters the vocabulary lacks are read as <unk>, and named
on stderr.
``--n-best K`` writes instead a table of each line's K best outputs with their
scores (``N_BEST_COLUMNS``); ``--score FILE`` translates nothing and scores the
outputs FILE gives, one per input line, the same way (``SCORE_COLUMNS``). For
the LM, ``--score FILE`` gives the loss, perplexity and bits per character of
a whole text (``LM_SCORES``). From Python, ``lib.use.inference`` does the same.
"""

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path

import torch

from lib.use import exported
from lib.core import files
from lib.use.attention_figures import (draw_lm_attention, draw_translation_attention,
                                   write_figures)
from lib.core.text import utf8_lines, utf8_text
from transformer.greedy import check_alpha
from lib.core.distributed import device_named
from lib.use.inference import LanguageModel
from lib.use.command import (N_BEST_COLUMNS, SAMPLE_SEPARATOR, SCORE_COLUMNS, argument_parser,
                              check_options)
from lib.use.lines import Written, outputs_of, score_lines, translate_lines
from lib.tasks import get_task
from lib.data.tokenizer import continuation, lm_ids


def input_bytes(path: str) -> tuple[bytes, str]:
    """A file's (or stdin's, for "-") bytes, and its name for messages."""
    return (sys.stdin.buffer.read(), "stdin") if path == "-" else (Path(path).read_bytes(), path)


def read_input(path: str) -> str:
    """A UTF-8 file (or stdin) as text; bytes that are not UTF-8 are named by line."""
    return utf8_text(*input_bytes(path))


def read_lines(path: str) -> list[str]:
    """The lines of read_input's text as the prepare stage reads a data file's and a terminal's lines come:
    ended by "\\n" or "\\r\\n" only (lib.core.text.utf8_lines)."""
    return utf8_lines(*input_bytes(path))


def write_text(path: str, text: str):
    """Write ``text`` to ``path`` (``-``: stdout), whole. A file is replaced at once (``files.atomic_path``), and
    through a symlink the file it names, so the link stays; a path that is there but is no file (a device
    such as /dev/null, a named pipe, /dev/stdout at a terminal or pipe) is written into, as the shell's
    ``>`` does: replacing it would put a file where the device or pipe was."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    elif os.path.exists(path) and not os.path.isfile(path):  # both follow links, /proc's /dev/stdout too
        with files.naming(Path(path)), open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
    else:
        with files.atomic_path(os.path.realpath(path)) as tmp:
            tmp.write_text(text, encoding="utf-8")


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


def lm_tokens(tokenizers, text: str, what: str) -> list[int]:
    """The LM's token ids of ``text``; what it cannot read (<unk>) is named on stderr as part of ``what``."""
    ids, messages = lm_ids(tokenizers, text, what)
    for message in messages:
        print(f"generate: {message}", file=sys.stderr)
    return ids


def score_text(args: argparse.Namespace, lm: LanguageModel):
    """The LM's loss, perplexity and bits per character on the whole of --score, as JSON."""
    text = read_input(args.score)
    ids = lm_tokens(lm.tokenizers, text, "--score")
    scores = lm.score_ids(ids, len(text), f"--score {args.score}")
    if args.attention:
        write_figures(Path(args.attention), lambda figures: draw_lm_attention(lm, ids, figures, "the text"))
    write_text(args.output, json.dumps(scores, indent=2) + "\n")


def continue_prompts(args: argparse.Namespace, lm: LanguageModel, prompts):
    """--num-samples continuations of each of ``prompts`` ((text, what names it) pairs), all drawn from one
    generator seeded by --seed. To stdout, each is shown as it is drawn; an --output file is written whole
    at the end. --attention draws the first sample's."""
    generator, shown = torch.Generator().manual_seed(args.seed), args.output == "-"
    show = (lambda text: write_text("-", text)) if shown else (lambda text: None)
    texts, first = [], None
    for prompt, what in prompts:
        ids = lm_tokens(lm.tokenizers, prompt, what)
        for _ in range(args.num_samples):
            if texts:
                show(SAMPLE_SEPARATOR + "\n")
            show(prompt)
            out, text = list(ids), prompt
            for piece in continuation(lm.tokenizers.target, out, lm.sampled_ids(
                    ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p, generator)):
                show(piece)
                text += piece
            show("\n")
            texts.append(text + "\n")
            first = first or out
    if args.attention and first:
        write_figures(Path(args.attention), lambda figures: draw_lm_attention(
            lm, first, figures, "the prompt and its continuation"))
    if not shown:
        write_text(args.output, (SAMPLE_SEPARATOR + "\n").join(texts))


def prompts_given(args: argparse.Namespace):
    """--prompt's text; with --prompt -, the whole of stdin, or, typed at a terminal, each line as it is
    entered (until Ctrl-D)."""
    if args.prompt != "-":
        yield args.prompt, "the prompt"
    elif not sys.stdin.isatty():
        if not (text := read_input("-")):
            raise ValueError("--prompt -: stdin is empty; the LM continues a text")
        yield text, "--prompt - (stdin)"
    else:
        print("generate: continuing each line as you enter it; Ctrl-D to end", file=sys.stderr)
        for number, raw in enumerate(iter(sys.stdin.buffer.readline, b""), 1):
            if line := utf8_text(raw, "stdin", first_line=number).rstrip("\r\n"):
                yield line, f"line {number}"
            else:
                print(f"generate: line {number}: empty; type a text for the LM to continue", file=sys.stderr)


def main(argv=None):
    parser = argument_parser()
    args = parser.parse_args(argv)
    try:
        if args.output != "-":  # found out before the work, not after it
            files.check_writable(args.output, option="--output")
        if args.attention:
            files.check_writable(args.attention, directory=True, option="--attention")
        kind = get_task(args.task).kind
        directory = Path(args.models or Path("models") / args.task)
        check_options(parser, args, kind, directory)  # before the model loads
        for option, path in (("--input", args.input), ("--score", args.score)):
            if path and path != "-":
                files.check_readable(path, option=option)
        model, tokenizers, state = exported.load_directory(directory, device_named(args.device, "--device"),
                                                             "--models" if args.models else "", args.task)
        if state["kind"] != kind:  # a model file from before the task was recorded
            raise ValueError(f"{directory / 'model.pt'} holds a model of kind {state['kind']!r}, but {args.task} "
                             f"is a {kind!r} task")
        if kind == "seq2seq":  # the bound is the model's: named before any input is read
            check_alpha(model, args.alpha, "--alpha")
        if kind == "seq2seq" and typed(args):
            translate_typed(args, model, tokenizers)
        elif kind == "seq2seq":
            translate_file(args, model, tokenizers)
        elif args.score:
            score_text(args, LanguageModel(model, tokenizers, state["block_size"]))
        else:
            continue_prompts(args, LanguageModel(model, tokenizers, state["block_size"]), prompts_given(args))
    except BrokenPipeError:  # the reader of stdout stopped early (`| head`): what it took was what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit cannot fail again
        sys.exit(1)
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"generate: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # the output file is written whole at the end, so there is nothing to clean up
        sampling = args.prompt is not None and not args.score
        shown = args.output == "-" and (typed(args) or sampling)  # each output, as it came
        print("generate: interrupted" + ("" if shown else "; --output was not written"), file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
