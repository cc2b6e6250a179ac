"""tokenize@<task>: learn the vocabulary from the training split, save it into --out (a directory)."""

from lib.cli import DIRECTORY, stage_main
from lib.tokenizer import run

READS = ["data"]  # the paths the stage reads, as --options
WRITES = {"out": DIRECTORY}  # and those it writes


def main(argv=None):
    stage_main("tokenize", READS, WRITES, lambda task, cfg, a: run(task, cfg, a.data, a.out), argv)


if __name__ == "__main__":
    main()
