"""fetch@<task>: download (checked against published sums) or copy the task's source files into --out."""

from lib.stage.cli import DIRECTORY, stage_main
from lib.tasks.writing import run_fetch

READS = []  # the paths the stage reads, as --options
WRITES = {"out": DIRECTORY}  # and those it writes


def main(argv=None):
    stage_main("fetch", READS, WRITES, lambda task, cfg, a: run_fetch(task, cfg, a.out), argv)


if __name__ == "__main__":
    main()
