"""report@<task>: write report.md with the metrics, loss curves and attention heatmaps, and losses.csv."""

from lib.cli import DIRECTORY, FILE, stage_main
from lib.reporting import run

READS = ["data", "tokenizer", "model", "metrics", "samples", "lengths", "live"]  # the paths read, as --options
WRITES = {"out": FILE, "figures": DIRECTORY, "losses": FILE}  # and those it writes


def main(argv=None):
    stage_main("report", READS, WRITES, lambda task, cfg, a: run(
        task, cfg, a.data, a.tokenizer, a.model, a.metrics, a.samples, a.lengths, a.live, a.out, a.figures,
        a.losses), argv)


if __name__ == "__main__":
    main()
