"""evaluate@<task>: score the trained model on the test split; write metrics and samples."""

from lib.cli import stage_main
from lib.evaluation import run


def main(argv=None):
    stage_main(
        "evaluate",
        ["data", "tokenizer", "model", "metrics", "samples"],
        lambda task, cfg, a: run(task, cfg, a.data, a.tokenizer, a.model, a.metrics, a.samples),
        argv,
    )


if __name__ == "__main__":
    main()
