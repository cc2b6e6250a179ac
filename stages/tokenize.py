"""tokenize@<task>: learn the vocabulary from the training split, save it into --out (a directory)."""

from lib.stage.cli import DIRECTORY, stage_main
from lib.tasks.writing import run_tokenize

READS = ["data"]  # the paths the stage reads, as --options
WRITES = {"out": DIRECTORY}  # and those it writes


def main(argv=None):
    stage_main("tokenize", READS, WRITES, lambda task, cfg, a: run_tokenize(task, cfg, a.data, a.out), argv)


if __name__ == "__main__":
    main()
