"""WMT14 at full size, without the corpus: a synthetic one of the real one's size and make, through fetch,
prepare, tokenize (the BPE learned, then every training and validation id written once) and train's start-up,
each timed and its peak memory measured; then the tokens a step of the shipped batch holds.

The real corpus cannot be fetched offline, so this builds one of 4,508,785 pairs in wmt/wmt14's layout
(de-en/train-*.parquet, validation-*, test-*) that looks like it where the cost lies: words drawn by their
frequency in real English and German (wordfreq's large lists: 321,180 and 634,502 word types, about 30% of
the German ones capitalised as nouns are), a sentence's words log-normal with WMT's mean of about 23 and a
long tail (1% over 77), commas and final punctuation, and 3% crawled lines (long URLs, runs of punctuation,
unspaced Chinese, Cyrillic). Then each stage runs as `dvc repro` runs it, under /usr/bin/time -v. Run from
the repository root with the venv active:
    PYTHONPATH=. python benchmarks/wmt14/scale.py [--pairs 4508785] [--work DIR]
Prints one JSON object: each stage's wall seconds and peak memory, the bytes each output holds, the seconds
train takes to its first step, and the mean real tokens a side of the shipped batch (train.max_tokens,
train.batch_unit).
"""

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from lib.data.tokenizer import load_tokenizers
from tools.results import header

ROOT = Path(__file__).resolve().parents[2]
SHARD_ROWS = 500_000  # rows per synthetic parquet file, as the hub splits its train split


MEAN_WORDS, SIGMA = 23.0, 0.6  # the log-normal of a sentence's words: WMT14 en-de's mean, a long tail
CRAWLED = 0.03  # the share of training lines from web crawls at their worst


class Vocabulary:
    """A language's word types and their frequencies, from wordfreq's large list."""

    def __init__(self, lang: str, capitalised: float, rng: np.random.Generator):
        import wordfreq  # a benchmark's own dependency: the lists the corpus draws from

        frequencies = wordfreq.get_frequency_dict(lang, wordlist="large")
        words = np.array(list(frequencies), dtype=object)
        nouns = rng.random(len(words)) < capitalised
        words[nouns] = [w.capitalize() for w in words[nouns]]
        self.words, self.cumulative = words, np.cumsum(np.fromiter(frequencies.values(), dtype=np.float64))

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.words[np.searchsorted(self.cumulative, rng.random(n) * self.cumulative[-1])]


def sentences(vocabulary: Vocabulary, lengths: np.ndarray, rng: np.random.Generator) -> list[str]:
    """One sentence of each length: words by frequency, a comma after 6% of them, a capital and a full stop
    (or ? or !) at the end."""
    words = vocabulary.draw(int(lengths.sum()), rng)
    commas = rng.random(len(words)) < 0.06
    words[commas] = [w + "," for w in words[commas]]
    ends = rng.choice(np.array([".", "?", "!", ""], dtype=object), len(lengths), p=[0.85, 0.05, 0.02, 0.08])
    starts = np.cumsum(lengths) - lengths
    return [(" ".join(words[a:a + n]).capitalize() + end) for a, n, end in zip(starts, lengths, ends)]


def crawled_line(rng: random.Random) -> str:
    """A line as web crawls hold them: a long URL, a run of punctuation, unspaced Chinese, or Cyrillic."""
    kind = rng.randrange(4)
    if kind == 0:
        path = "/".join(f"{rng.choice('abcdefghij')}{rng.randrange(10 ** 4)}" for _ in range(rng.randint(5, 60)))
        return f"Visit https://www.example{rng.randrange(999)}.com/{path}?id={rng.randrange(10 ** 6)}&lang=de"
    if kind == 1:
        return "Click here " + rng.choice(".-*=!") * rng.randint(20, 300)
    if kind == 2:
        return "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(rng.randint(20, 200)))
    return " ".join("".join(chr(rng.randrange(0x430, 0x450)) for _ in range(rng.randint(2, 12)))
                    for _ in range(rng.randint(3, 40)))


def rows(n: int, vocabularies: dict, rng: np.random.Generator, crawled: float) -> list[dict]:
    """``n`` pairs: English and German sentences of related lengths, a ``crawled`` share of them a crawled line
    on both sides (left untranslated, as crawls hold them)."""
    en = np.clip(np.rint(rng.lognormal(np.log(MEAN_WORDS) - SIGMA ** 2 / 2, SIGMA, n)), 1, 250).astype(np.int64)
    de = np.clip(np.rint(en * rng.lognormal(np.log(0.95), 0.15, n)), 1, 250).astype(np.int64)
    pairs = [{"en": a, "de": b} for a, b in zip(sentences(vocabularies["en"], en, rng),
                                                sentences(vocabularies["de"], de, rng))]
    lines = random.Random(int(rng.integers(2 ** 31)))
    for i in np.flatnonzero(rng.random(n) < crawled):
        line = crawled_line(lines)
        pairs[i] = {"en": line, "de": line}
    return pairs


def write_corpus(root: Path, n_train: int, seed: int = 0):
    """``n_train`` training pairs, 3,000 validation and 3,003 test (news: no crawled lines), in the hub's layout."""
    rng = np.random.default_rng(seed)
    vocabularies = {"en": Vocabulary("en", 0.05, rng), "de": Vocabulary("de", 0.3, rng)}
    folder = root / "de-en"
    folder.mkdir(parents=True)
    shards = -(-n_train // SHARD_ROWS)
    for shard in range(shards):
        n = min(SHARD_ROWS, n_train - shard * SHARD_ROWS)
        pq.write_table(pa.table({"translation": rows(n, vocabularies, rng, CRAWLED)}),
                       folder / f"train-{shard:05d}-of-{shards:05d}.parquet")
    for name, n in (("validation", 3000), ("test", 3003)):
        pq.write_table(pa.table({"translation": rows(n, vocabularies, rng, 0.0)}),
                       folder / f"{name}-00000-of-00001.parquet")


def tokens_a_step(tokenizer_dir: Path, train: dict, vocab_size: int) -> dict:
    """The mean real (non-pad) tokens a side in the shipped batch (train.max_tokens, train.batch_unit), over
    an epoch of the written ids, with accumulate's batches to a step; the pairs train skips as too long; and
    the base model's mean training FLOPs a step (lib.model.hardware.training_flops, on the real lengths)."""
    import torch

    from lib.core.config import ModelConfig
    from lib.data.pairs import token_budget_batches
    from lib.data.token_store import MappedPairs
    from lib.model.lengths import fit_lengths
    from lib.model.hardware import training_flops

    pairs, skipped = fit_lengths(MappedPairs(tokenizer_dir, "train"), train["model"]["max_len"], "train", "skip")
    batches = token_budget_batches(pairs, train["max_tokens"], torch.Generator().manual_seed(0), train["batch_unit"])
    src, tgt = pairs.side_lengths()
    model = ModelConfig(**train["model"])
    flops = sum(training_flops(model, vocab_size, src[rows].tolist(), tgt[rows].tolist())
                for rows in map(torch.tensor, batches))
    steps = len(batches) / train["accumulate"]
    return {"max_tokens": train["max_tokens"], "batch_unit": train["batch_unit"], "steps_an_epoch": round(steps),
            "mean_src_tokens": round(src.sum().item() / steps), "mean_tgt_tokens": round(tgt.sum().item() / steps),
            "tflop_a_step": round(flops / steps / 1e12, 3), "skipped_too_long": skipped}


def projection(step_tflop: float, steps: int, mfu: float, peak_tflops: float) -> dict:
    """Hours for ``steps`` steps of ``step_tflop`` at a model FLOPs utilisation ``mfu`` of ``peak_tflops``: a
    projection, not a run."""
    return {"steps": steps, "mfu": mfu, "peak_tflops": peak_tflops,
            "hours": round(steps * step_tflop / (mfu * peak_tflops) / 3600, 2)}


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
    parser.add_argument("--pairs", type=int, default=4_508_785, help="training pairs (default: WMT14's)")
    parser.add_argument("--work", type=Path, help="where to build (default: a temporary directory)")
    parser.add_argument("--mfu", type=float, default=0.15, help="the MFU to project with (an H200's measured at "
                        "d_model 512, 58,214 tokens a step, docs/results.md)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100, H200)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="wmt14_scale_"))
    started = time.perf_counter()
    write_corpus(work / "hub", args.pairs)
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
    shipped = yaml.safe_load((ROOT / "params.yaml").read_text())["wmt14"]
    vocab_size = load_tokenizers(work / "tokenizer").target.get_vocab_size()
    steps = tokens_a_step(work / "tokenizer", shipped["train"], vocab_size)
    steps["projected_one_gpu"] = projection(steps["tflop_a_step"], shipped["train"]["max_steps"], args.mfu,
                                            args.peak_tflops)
    print(json.dumps({**header("wmt14_scale"), "pairs": args.pairs, "corpus_built_s": built, "corpus_bytes": size(
                          work / "hub"), "stages": figures, "tokens_a_step": steps,
                      "cleaning": json.loads((work / "data" / "cleaning.json").read_text())["train"]}, indent=1))


if __name__ == "__main__":
    main()
