"""tokenize@<task>: learn the vocabulary from the training split, save it into --out (a directory)."""

from lib.cli import stage_main
from lib.tokenizer import run


def main(argv=None):
    stage_main("tokenize", ["data", "out"], lambda task, cfg, a: run(task, cfg, a.data, a.out), argv)


if __name__ == "__main__":
    main()
