"""Where the tokenize stage's time goes once the BPE is learned: writing every id of the training split
(lib.data.tokenizer.write_splits), split into its parts and timed on scale.py's synthetic corpus.

Per batch of rows: reading it from parquet into Python strings; the tokenizer's encode_batch (Rust, on
every core); taking each encoding's ids out as Python lists; and packing them into int32 arrays and
writing them (lib.data.token_store.write_pairs). Also encode_batch_fast, which skips the character offsets.
Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/wmt14/encode_cost.py [--pairs 300000]
Prints one JSON object: each part's seconds, its share, and the whole projected to WMT14's 4,508,785 pairs.
"""

import argparse
import json
import resource
import tempfile
import time
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from benchmarks.wmt14.scale import write_corpus
from lib.core.sections import TokenizeConfig
from lib.data.tokenizer import train_tokenizer
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]
WMT14_PAIRS = 4_508_785
BATCH_ROWS = 100_000  # lib.data.tokenizer.write_splits' batch


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300_000, help="training pairs to encode")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wmt14_encode_"))
    write_corpus(work / "hub", args.pairs)
    files = sorted((work / "hub" / "de-en").glob("train-*.parquet"))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())["wmt14"]["tokenize"]
    texts = (text for file in files for row in pq.read_table(file).column("translation").to_pylist()
             for text in row.values())
    tokenizer = train_tokenizer(TokenizeConfig(**params), texts)

    parts = {"read": 0.0, "encode": 0.0, "ids": 0.0, "store": 0.0}
    encode_cpu, fast_encode, sentences = 0.0, 0.0, 0
    with open(work / "ids", "wb") as out:
        for file in files:
            for batch in pq.ParquetFile(file).iter_batches(batch_size=BATCH_ROWS, columns=["translation"]):
                started = time.perf_counter()
                pairs = batch.column("translation")
                sides = [pairs.field(lang).to_pylist() for lang in ("en", "de")]
                parts["read"] += time.perf_counter() - started
                for side in sides:
                    started, cpu = time.perf_counter(), cpu_seconds()
                    encodings = tokenizer.encode_batch(side, add_special_tokens=False)
                    parts["encode"] += time.perf_counter() - started
                    encode_cpu += cpu_seconds() - cpu
                    started = time.perf_counter()
                    seqs = [encoding.ids for encoding in encodings]
                    parts["ids"] += time.perf_counter() - started
                    started = time.perf_counter()
                    lengths = np.fromiter(map(len, seqs), dtype=np.int32, count=len(seqs))
                    out.write(np.fromiter(chain.from_iterable(seqs), dtype=np.int32, count=int(lengths.sum()))
                              .tobytes())
                    out.write(lengths.tobytes())
                    parts["store"] += time.perf_counter() - started
                    started = time.perf_counter()
                    tokenizer.encode_batch_fast(side, add_special_tokens=False)
                    fast_encode += time.perf_counter() - started
                    sentences += len(side)
    total = sum(parts.values())
    print(json.dumps({
        **header("wmt14_encode_cost"), "pairs": args.pairs, "sentences": sentences,
        "seconds": {name: round(value, 2) for name, value in parts.items()},
        "share": {name: round(value / total, 3) for name, value in parts.items()},
        "encode_cores_busy": round(encode_cpu / parts["encode"], 2),
        "encode_batch_fast_seconds": round(fast_encode, 2),
        "projected_wmt14_s": round(total * WMT14_PAIRS / args.pairs, 1)}, indent=1))


if __name__ == "__main__":
    main()
