"""train@<task>: train (or resume) the model; write the best weights and per-step metrics."""

from lib.cli import stage_main
from lib.training import run


def main(argv=None):
    stage_main(
        "train",
        ["data", "tokenizer", "model", "checkpoints", "live"],
        lambda task, cfg, a: run(task, cfg, a.data, a.tokenizer, a.model, a.checkpoints, a.live),
        argv,
    )


if __name__ == "__main__":
    main()
