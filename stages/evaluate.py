"""evaluate@<task>: score the trained model on the test split; write metrics, samples and the score by length."""

from lib.stage.cli import FILE, stage_main
from lib.evaluate.evaluation import EvaluatePaths
from lib.evaluate.families import run

READS = ["data", "tokenizer", "model"]  # the paths the stage reads, as --options
WRITES = {"metrics": FILE, "samples": FILE, "lengths": FILE, "generation": FILE}  # and those it writes


def main(argv=None):
    stage_main("evaluate", READS, WRITES, lambda task, cfg, a: run(
        task, cfg, EvaluatePaths(**{name: getattr(a, name) for name in (*READS, *WRITES)})), argv)


if __name__ == "__main__":
    main()
