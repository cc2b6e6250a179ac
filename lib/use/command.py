"""generate's command line: its flags, and the checks made before any work (lib.use.generate does the work)."""

import argparse
import os
from pathlib import Path

from lib.core import files
from lib.evaluate.options import GENERATION_FILE, model_defaults, problems
from lib.tasks import task_names
from lib.use.attention_figures import FIGURE_FILES, LM_ATTENTION_TOKENS, is_a_figure

N_BEST_COLUMNS = ("line", "rank", "score", "log_prob", "tokens", "eos", "translation")
SCORE_COLUMNS = ("line", "score", "log_prob", "tokens", "least_likely", "translation")  # --score: eos true
LM_SCORES = ("tokens", "loss", "perplexity", "bits_per_char")  # --score for an LM: lib.evaluate.evaluation.text_metrics
AS_EVALUATED = "as the evaluate stage decoded (the model's generation.json)"
SAMPLE_SEPARATOR = "-" * 15  # between an LM's samples, as nanoGPT's sample.py prints them


def replaces(output: str, path: str) -> bool:
    """Whether ``write_text(output, ...)`` replaces the file at ``path``: the file that ``output``'s links lead
    to. (A device is written into, not replaced: /dev/stdout may be the terminal /dev/stdin reads.)"""
    return os.path.isfile(output) and files.placed(output, path) == "is"


def takes_a_figure(output: str, attention: str) -> bool:
    """Whether ``output``, written after the figures, replaces one: it, or the file its links lead to, is in
    the ``attention`` directory by a name in FIGURE_FILES."""
    return any(files.placed(Path(path).parent, attention) == "is"
               and is_a_figure(Path(path).name)
               for path in (output, os.path.realpath(output)))


# What the pipeline writes in a models directory, by the stage that writes it: nothing generate writes may go
# there (a replaced model.pt is lost; a file more in an output makes `dvc repro` run its stage again).
MODEL_FILES = {"model.pt": "train", "tokenizer": "tokenize", "checkpoints": "train", GENERATION_FILE: "evaluate"}


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace, family, every_option: tuple[str, ...],
                  directory: Path):
    """One error naming every option that is missing, out of range, or set but meant for another model family
    than the task's (``family``, lib.use.families'; ``every_option``: all the families' options), and every
    output that would replace what it reads (--input, --score) or what ``directory``, the models directory,
    holds. An option not given takes the model's default (lib.evaluate.options.model_defaults)."""
    given = {dest for dest in every_option if getattr(args, dest) != parser.get_default(dest)}
    for dest, value in model_defaults(directory).items():
        if dest in family.options and dest not in given and dest != "n_best":  # --n-best unset: one output
            setattr(args, dest, value)
    errors = family.command_errors(args)
    errors += problems({dest: getattr(args, dest) for dest in family.ranged}, flag)
    if args.score:
        if generating := [flag(dest) for dest in family.steering if dest in given]:
            errors.append(f"{', '.join(generating)}: not with --score (it scores the text given; nothing is generated)")
        if args.score == "-" and args.input == "-":
            errors.append("--input and --score cannot both be stdin")
    # --output is replaced whole, once the inputs are read: an input it names would be lost
    errors += [f"--output {args.output}: the {option} file; the outputs would replace it (name another file)"
               for option, path in (("--input", args.input), ("--score", args.score))
               if path and "-" not in (path, args.output) and replaces(args.output, path)]
    # --attention's directory is made first, then --output is written: in it would be a file; under it, none
    if args.attention and args.output != "-":
        if how := files.placed(args.attention, args.output):
            errors.append(f"--attention {args.attention}: {how} --output {args.output}, the file the outputs go to "
                          "(name another directory)")
        elif takes_a_figure(args.output, args.attention):
            errors.append(f"--output {args.output}: in --attention {args.attention}, by a name the figures take "
                          f"({', '.join(FIGURE_FILES)}); the outputs would replace one (name another file)")
    errors += [files.written_by(f"{option} {path}", how, directory / name, stage)
               for option, path in (("--output", args.output), ("--attention", args.attention)) if path and path != "-"
               for name, stage in MODEL_FILES.items() if (how := files.placed(path, directory / name))]
    if misplaced := [flag(dest) for dest in every_option if dest in given and dest not in family.options]:
        errors.append(f"{', '.join(misplaced)}: not for {args.task} ({family.title})")
    if errors:
        raise ValueError("; ".join(errors))


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lib.use.generate",
                                     description="Use a trained model: translate a file line by line, or continue a "
                                                 "prompt with the LM.")
    parser.add_argument("--task", required=True, choices=task_names(),
                        help="a task the pipeline trained (models/<task>/)")
    parser.add_argument("--models", type=os.path.expanduser,
                        help="the directory with model.pt and tokenizer/ (default: models/<task>)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default), cuda, cuda:N, or auto (a GPU where there is one)")
    parser.add_argument("--output", default="-", type=os.path.expanduser,
                        help="one translation per line (a table with --n-best or --score), or the LM's text (JSON "
                             "with --score); - for stdout (default)")
    translation = parser.add_argument_group("translation (seq2seq tasks)")
    translation.add_argument("--input", type=os.path.expanduser, help="one source sentence per line; - for stdin")
    translation.add_argument("--beam-size", type=int, help=f"1: greedy; default: {AS_EVALUATED} (else 1)")
    translation.add_argument("--alpha", type=float,
                             help=f"beam search's (and --score's) length penalty; default: {AS_EVALUATED} (else 0.6)")
    translation.add_argument("--max-extra-tokens", type=int,
                             help="an output has at most source length + this many tokens; default: "
                                  f"{AS_EVALUATED} (else 20)")
    translation.add_argument("--max-tokens", type=int, help=f"token budget of a batch; default: {AS_EVALUATED}")
    translation.add_argument("--n-best", type=int, metavar="K",
                             help="write each line's K best outputs (K <= --beam-size) with their scores, as a "
                                  "tab-separated table: " + ", ".join(N_BEST_COLUMNS))
    parser.add_argument("--score", metavar="FILE", type=os.path.expanduser,
                        help="generate nothing: score the text given. Translation: one output per --input line "
                             "(say, reference translations), as beam search would rank it, in a tab-separated "
                             f"table: {', '.join(SCORE_COLUMNS)}. LM: a whole text's {', '.join(LM_SCORES)}, "
                             "as JSON")
    lm = parser.add_argument_group("language model (lm tasks)")
    lm.add_argument("--prompt", help="the text to continue; - reads it from stdin (at a terminal: each line, "
                                     "continued as soon as it is entered)")
    lm.add_argument("--max-new-tokens", type=int, help=f"default: {AS_EVALUATED} (else 200)")
    lm.add_argument("--temperature", type=float, help=f"default: {AS_EVALUATED} (else 0.8)")
    lm.add_argument("--top-k", type=int, help=f"0: no top-k filter; default: {AS_EVALUATED} (else 0)")
    lm.add_argument("--top-p", type=float, help=f"1: no nucleus filter; default: {AS_EVALUATED} (else 1)")
    lm.add_argument("--seed", type=int, help=f"default: {AS_EVALUATED} (else 0)")
    lm.add_argument("--num-samples", type=int,
                    help=f"continuations of the prompt, drawn one after another from the seeded generator and "
                         f"separated by a line {SAMPLE_SEPARATOR!r} (default 1; --attention draws the first's)")
    parser.add_argument("--attention", metavar="DIR", type=os.path.expanduser,
                        help="also draw the attention that wrote each output, every layer and head: DIR/attention.md "
                             "and its PNGs (three per translated line: meant for a few sentences; the LM's covers "
                             f"the first {LM_ATTENTION_TOKENS} tokens, at most its training block)")
    return parser
