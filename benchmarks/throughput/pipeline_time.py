"""Wall time of the whole default pipeline, `dvc repro --force`, and what it reached.

Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/throughput/pipeline_time.py
Prints one JSON object: seconds for the pipeline, the tasks, and each task's
test metrics. It rebuilds every stage of the enabled tasks in place.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


from lib.core.text import load_params
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]


def main():
    # No options, but --help must print this rather than start a forced rebuild.
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    tasks = load_params(ROOT / "params.yaml")["tasks"]  # read as dvc reads it
    dvc = str(Path(sys.executable).with_name("dvc"))
    start = time.perf_counter()
    subprocess.run([dvc, "repro", "--force"], cwd=ROOT, check=True, stdout=sys.stderr)  # stdout: the JSON only
    seconds = time.perf_counter() - start
    metrics = {t: json.loads((ROOT / "reports" / t / "metrics.json").read_text()) for t in tasks}
    print(json.dumps({
        **header("pipeline_time"), "seconds": round(seconds, 1), "tasks": tasks, "metrics": metrics,
    }, indent=2))


if __name__ == "__main__":
    main()
