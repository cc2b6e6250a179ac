"""report@<task>: write report.md with the metrics, loss curves and attention heatmaps; report.html, the same
with an interactive attention view; card.html, the headline reports/index.html shows; losses.csv and
valid_score.csv, the loss and validation-score plots."""

from lib.stage.cli import DIRECTORY, FILE, stage_main
from lib.report.reporting import ReportPaths, run

READS = ["data", "tokenizer", "model", "metrics", "samples", "lengths", "live"]  # the paths read, as --options
# and those it writes
WRITES = {"out": FILE, "page": FILE, "card": FILE, "figures": DIRECTORY, "losses": FILE, "scores": FILE}


def main(argv=None):
    stage_main("report", READS, WRITES, lambda task, cfg, a: run(
        task, cfg, ReportPaths(**{name: getattr(a, name) for name in (*READS, *WRITES)})), argv)


if __name__ == "__main__":
    main()
