"""report@<task>: write report.md with the metrics, loss curves and attention heatmaps."""

from lib.cli import DIRECTORY, FILE, stage_main
from lib.reporting import run

READS = ["data", "tokenizer", "model", "metrics", "samples", "live"]  # the paths the stage reads, as --options
WRITES = {"out": FILE, "figures": DIRECTORY}  # and those it writes


def main(argv=None):
    stage_main("report", READS, WRITES, lambda task, cfg, a: run(
        task, cfg, a.data, a.tokenizer, a.model, a.metrics, a.samples, a.live, a.out, a.figures), argv)


if __name__ == "__main__":
    main()
