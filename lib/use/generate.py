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

import os
import sys
from pathlib import Path

from lib.core import files
from lib.core.distributed import device_named
from lib.tasks import get_task
from lib.use import exported
from lib.use.command import argument_parser, check_options
from lib.use.families import EVERY_OPTION, USES
from lib.use.translate_cli import typed


def main(argv=None):
    parser = argument_parser()
    args = parser.parse_args(argv)
    try:
        if args.output != "-":  # found out before the work, not after it
            files.check_writable(args.output, option="--output")
        if args.attention:
            files.check_writable(args.attention, directory=True, option="--attention")
        family = USES[get_task(args.task).family]
        directory = Path(args.models or Path("models") / args.task)
        check_options(parser, args, family, EVERY_OPTION, directory)  # before the model loads
        for option, path in (("--input", args.input), ("--score", args.score)):
            if path and path != "-":
                files.check_readable(path, option=option)
        model, tokenizers, state = exported.load_folder(directory, device_named(args.device, "--device"),
                                                             "--models" if args.models else "", args.task)
        if state["kind"] != family.name:  # a model file from before the task was recorded
            raise ValueError(f"{directory / 'model.pt'} holds a model of kind {state['kind']!r}, but {args.task} "
                             f"is a {family.name!r} task")
        family.run_command(args, model, tokenizers, state)
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
