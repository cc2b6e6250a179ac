"""prepare@<task>: make the task's data splits, or read them from the files fetch put in --source, into --out."""

from lib.stage.cli import DIRECTORY, stage_main
from lib.tasks.writing import run_prepare

READS = ["source"]  # the paths the stage reads, as --options
WRITES = {"out": DIRECTORY}  # and those it writes


def main(argv=None):
    stage_main("prepare", READS, WRITES, lambda task, cfg, a: run_prepare(task, cfg, a.out, a.source), argv)


if __name__ == "__main__":
    main()
