"""report@<task>: write report.md with the metrics, loss curves and attention heatmaps."""

from lib.cli import stage_main
from lib.reporting import run


def main(argv=None):
    stage_main(
        "report",
        ["data", "tokenizer", "model", "metrics", "samples", "live", "out", "figures"],
        lambda task, cfg, a: run(
            task, cfg, a.data, a.tokenizer, a.model, a.metrics, a.samples, a.live, a.out, a.figures
        ),
        argv,
    )


if __name__ == "__main__":
    main()
