"""What every study's and tool's result line starts with, so that a figure in docs/results.md says where and
when it was measured."""

import platform
from datetime import date

import torch


def header(benchmark: str) -> dict:
    """The study's name, the date, the machine, the threads torch uses and its build."""
    return {"benchmark": benchmark, "date": date.today().isoformat(),
            "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}
