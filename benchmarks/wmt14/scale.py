"""WMT14 at full size, without the corpus: a synthetic one of the real one's size, through fetch, prepare,
tokenize (the BPE learned, then every training and validation id written once) and train's start-up, each
timed and its peak memory measured.

The real corpus cannot be fetched offline, so this builds one of 4,508,785 pairs in wmt/wmt14's layout
(de-en/train-*.parquet, validation-*, test-*) from Multi30k's raw files: each pair joins two Multi30k pairs,
English and German alike, for about WMT's 23 words a sentence. Then each stage runs as `dvc repro` runs it,
under /usr/bin/time -v. Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/wmt14/scale.py --multi30k /path/to/multi30k [--pairs 4508785] [--work DIR]
Prints one JSON object: each stage's wall seconds and peak memory, the bytes each output holds, and the
seconds train takes to its first step.
"""

import argparse
import gzip
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tools.results import header

ROOT = Path(__file__).resolve().parents[2]
SHARD_ROWS = 500_000  # rows per synthetic parquet file, as the hub splits its train split


def multi30k_pairs(folder: Path) -> list[tuple[str, str]]:
    english, german = ((gzip.decompress((folder / f"train.{lang}.gz").read_bytes()).decode().splitlines())
                       for lang in ("en", "de"))
    return list(zip(english, german))


def write_corpus(root: Path, pairs: list[tuple[str, str]], n_train: int, seed: int = 0):
    """``n_train`` training pairs, 3,000 validation and 3,003 test, each two Multi30k pairs joined."""
    rng = random.Random(seed)
    folder = root / "de-en"
    folder.mkdir(parents=True)

    def rows(n: int) -> list[dict]:
        picked = [(pairs[rng.randrange(len(pairs))], pairs[rng.randrange(len(pairs))]) for _ in range(n)]
        return [{"en": f"{a[0]} {b[0]}", "de": f"{a[1]} {b[1]}"} for a, b in picked]

    shards = -(-n_train // SHARD_ROWS)
    for shard in range(shards):
        n = min(SHARD_ROWS, n_train - shard * SHARD_ROWS)
        pq.write_table(pa.table({"translation": rows(n)}), folder / f"train-{shard:05d}-of-{shards:05d}.parquet")
    for name, n in (("validation", 3000), ("test", 3003)):
        pq.write_table(pa.table({"translation": rows(n)}), folder / f"{name}-00000-of-00001.parquet")


def timed(command: list[str], cwd: Path) -> dict:
    """``command`` under /usr/bin/time -v: its wall seconds and peak resident memory (GB)."""
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *command], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return {"seconds": round(time.perf_counter() - started, 1), "peak_gb": round(peak_kb / 2 ** 20, 2)}


def startup(command: list[str], curve: Path, cwd: Path, limit_s: float = 600) -> dict:
    """Seconds from starting ``command`` (the train stage) to its first logged step, and its peak memory then;
    the process is stopped there."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_kb = 0
    while not (curve.is_file() and len(curve.read_text().splitlines()) > 1):
        if process.poll() is not None:
            sys.exit(f"train stopped before its first step:\n{process.stderr.read()[-3000:]}")
        if time.perf_counter() - started > limit_s:
            process.kill()
            sys.exit(f"no step within {limit_s} s")
        status = Path(f"/proc/{process.pid}/status").read_text()
        peak_kb = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    process.kill()
    process.wait()
    return {"seconds_to_first_step": round(seconds, 1), "peak_gb": round(peak_kb / 2 ** 20, 2)}


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k", required=True, type=Path, help="a folder of Multi30k's raw task-1 files")
    parser.add_argument("--pairs", type=int, default=4_508_785, help="training pairs (default: WMT14's)")
    parser.add_argument("--work", type=Path, help="where to build (default: a temporary directory)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="wmt14_scale_"))
    started = time.perf_counter()
    write_corpus(work / "hub", multi30k_pairs(args.multi30k), args.pairs)
    built = round(time.perf_counter() - started, 1)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tasks"] = ["wmt14"]
    params["wmt14"]["fetch"]["source"] = str(work / "hub")
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    python, common = sys.executable, ["--params", str(work / "params.yaml")]
    stages = {
        "fetch": [python, "-m", "stages.fetch", "wmt14", "--out", str(work / "sources"), *common],
        "prepare": [python, "-m", "stages.prepare", "wmt14", "--source", str(work / "sources"), "--out",
                    str(work / "data"), *common],
        "tokenize": [python, "-m", "stages.tokenize", "wmt14", "--data", str(work / "data"), "--out",
                     str(work / "tokenizer"), *common],
    }
    figures = {name: timed(command, ROOT) for name, command in stages.items()}
    for name, path in (("fetch", "sources"), ("prepare", "data"), ("tokenize", "tokenizer")):
        figures[name]["output_bytes"] = size(work / path)
    # Train's start-up at this size: a small model, so that its first step is over at once and the time is the
    # data's (the base model's own first step on a CPU takes most of a minute)
    params["wmt14"]["train"]["model"].update(d_model=64, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=128)
    (work / "small.yaml").write_text(yaml.safe_dump(params))
    figures["train_startup"] = startup(
        [python, "-m", "stages.train", "wmt14", "--data", str(work / "data"), "--tokenizer", str(work / "tokenizer"),
         "--model", str(work / "model.pt"), "--checkpoints", str(work / "checkpoints"), "--live", str(work / "live"),
         "--params", str(work / "small.yaml")], work / "live" / "plots" / "metrics" / "train" / "loss.tsv", ROOT)
    print(json.dumps({**header("wmt14_scale"), "pairs": args.pairs, "corpus_built_s": built, "corpus_bytes": size(
                          work / "hub"), "stages": figures,
                      "cleaning": json.loads((work / "data" / "cleaning.json").read_text())["train"]}, indent=1))


if __name__ == "__main__":
    main()
