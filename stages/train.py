"""train@<task>: train (or resume) the model; write the best weights and per-step metrics."""

from lib.stage.cli import DIRECTORY, FILE, stage_main
from lib.train.training import run

READS = ["data", "tokenizer"]  # the paths the stage reads, as --options
WRITES = {"model": FILE, "checkpoints": DIRECTORY, "live": DIRECTORY}  # and those it writes


def main(argv=None):
    stage_main("train", READS, WRITES,
               lambda task, cfg, a: run(task, cfg, a.data, a.tokenizer, a.model, a.checkpoints, a.live), argv)


if __name__ == "__main__":
    main()
