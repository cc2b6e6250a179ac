"""prepare@<task>: make or load the task's data splits into --out."""

from lib.cli import stage_main
from lib.tasks import run_prepare


def main(argv=None):
    stage_main("prepare", ["out"], lambda task, cfg, a: run_prepare(task, cfg, a.out), argv)


if __name__ == "__main__":
    main()
