"""Length generalisation on cumsum: train on lengths 4-12, exact match at every length 1-24,
once per position encoding (and Post-LN / Pre-LN).

Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/length_study.py [--variants sinusoidal learned rope alibi]
It uses the cumsum params of params.yaml, changing only the position encoding
(and, with --norm-first, Post-LN to Pre-LN), runs every stage's `run` in a
temporary directory, prints one JSON object and writes <out>.md and <out>.png
(default benchmarks/length_study.*). The page also says how many of the
sequences at each untrained length have every sum right and miss only where
the output stops. With --modulus 10 the targets are the sums' last digits, so
that longer sequences ask for no sum that training rarely saw (see
lib/tasks/cumsum.py): the positions alone are then tested. --no-source-eos
trains without the <eos> that ends each source (tokenize.source_eos).
The same study through DVC experiments, one queued run of the whole pipeline
per encoding, then this page from their metrics:
    for p in sinusoidal learned rope alibi; do
      dvc exp run --queue -n pos-$p -S cumsum.train.model.positional=$p; done
    dvc queue start && dvc queue status        # until all four are done
    PYTHONPATH=. python benchmarks/length_study.py --from-exps pos-sinusoidal pos-learned pos-rope pos-alibi
"""

import argparse
import dataclasses
import json
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lib import checkpoint, evaluation, tokenizer, training  # noqa: E402
from lib.config import load_params, stage_config  # noqa: E402
from lib.data import read_split  # noqa: E402
from lib.tasks import cumsum, run_prepare  # noqa: E402
from lib.tokenizer import encode_pairs, special_ids  # noqa: E402

HERE = Path(__file__).resolve().parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["sinusoidal", "learned", "rope", "alibi"])
    parser.add_argument("--norm-first", action="store_true", help="Pre-LN instead of the params' choice")
    parser.add_argument("--modulus", type=int, default=None,
                        help="cumsum.prepare.modulus for the data (10: targets are the sums' last digits)")
    parser.add_argument("--source-eos", action=argparse.BooleanOptionalAction,
                        help="cumsum.tokenize.source_eos, whether every source ends in <eos> (default: the params')")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override train params for every variant, e.g. model.dropout=0.0 label_smoothing=0")
    parser.add_argument("--out", default=str(HERE / "length_study"), help="stem of the .md and .png written")
    parser.add_argument("--from-exps", nargs="+", metavar="NAME",
                        help="read these DVC experiments' metrics (dvc exp show) instead of training")
    args = parser.parse_args()
    if args.from_exps:
        results = experiment_results(args.from_exps)
        write_page(results, "DVC experiments " + ", ".join(args.from_exps), Path(args.out))
        print(json.dumps({"benchmark": "length_study", "date": date.today().isoformat(), "results": results},
                         indent=2))
        return
    params = load_params(HERE.parent / "params.yaml")
    for item in args.set:
        key, value = item.split("=", 1)
        *path, last = ["cumsum", "train", *key.split(".")]
        node = params
        for part in path:
            node = node[part]
        node[last] = yaml.safe_load(value)
    if args.modulus is not None:
        params["cumsum"]["prepare"]["modulus"] = args.modulus
    if args.source_eos is not None:
        params["cumsum"]["tokenize"]["source_eos"] = args.source_eos
    cfg = {stage: stage_config(params, "cumsum", stage) for stage in ("prepare", "tokenize", "train", "evaluate")}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_prepare("cumsum", cfg["prepare"], tmp / "data")
        tokenizer.run("cumsum", cfg["tokenize"], tmp / "data", tmp / "tok")
        for variant in args.variants:
            model = dataclasses.replace(cfg["train"].model, positional=variant,
                                        norm_first=args.norm_first or cfg["train"].model.norm_first)
            train_cfg = dataclasses.replace(cfg["train"], model=model)
            run_dir = tmp / variant
            start = time.perf_counter()
            training.run("cumsum", train_cfg, tmp / "data", tmp / "tok", run_dir / "model.pt",
                         run_dir / "ckpt", run_dir / "live")
            seconds = time.perf_counter() - start
            metrics = evaluation.run("cumsum", cfg["evaluate"], tmp / "data", tmp / "tok", run_dir / "model.pt",
                                     run_dir / "metrics.json", run_dir / "samples.jsonl")
            results[variant] = {"train_s": round(seconds, 1), "exact_match": metrics["greedy"]["exact_match"],
                                "by_length": metrics["by_length"],
                                "stop_errors_by_length": stop_errors(cfg["evaluate"], tmp, run_dir / "model.pt")}
    setting = "Pre-LN" if args.norm_first or cfg["train"].model.norm_first else "Post-LN"
    if cfg["prepare"].modulus:
        setting += f", sums modulo {cfg['prepare'].modulus}"
    setting += ", sources end in <eos>" if cfg["tokenize"].source_eos else ", no <eos> on sources"
    if args.set:
        setting += ", " + ", ".join(args.set)
    write_page(results, setting, Path(args.out))
    print(json.dumps({"benchmark": "length_study", "date": date.today().isoformat(), "setting": setting,
                      "results": results}, indent=2))


def stop_errors(cfg, tmp: Path, model_path: Path) -> dict:
    """{"1": share of the length-1 sequences whose every sum is right but whose output stops too early
    or too late, ...}: the part of the misses at a length that is about where the output ends."""
    model, tokenizers, _ = checkpoint.load_trained(model_path, tmp / "tok")
    study = read_split(tmp / "data", "lengths")
    hypotheses = evaluation.translate_texts(model, encode_pairs(tokenizers, study), special_ids(tokenizers),
                                            tokenizers.target, cfg)
    stops = [wrong_stop_only(h.split(), r.split()) for h, r in zip(hypotheses, study["tgt"])]
    return cumsum.share_by_length(study["src"].tolist(), stops)


def wrong_stop_only(hypothesis: list[str], reference: list[str]) -> bool:
    """Every token the two share is right, and one is longer: the model stopped at the wrong place."""
    return len(hypothesis) != len(reference) and all(h == r for h, r in zip(hypothesis, reference))


def experiment_results(names: list[str]) -> dict:
    """{positional: {"exact_match", "by_length"}} of the named experiments, from `dvc exp show --json`."""
    shown = json.loads(subprocess.run(["dvc", "exp", "show", "--json"], capture_output=True, text=True,
                                      check=True, cwd=HERE.parent).stdout)
    found = {}

    def walk(node):  # experiments nest under their baseline commit: look everywhere
        if isinstance(node, dict):
            if node.get("name") in names and isinstance(node.get("data"), dict):
                found[node["name"]] = node["data"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(shown)
    missing = [name for name in names if name not in found]
    if missing:
        raise SystemExit(f"no finished experiment named {', '.join(missing)} (dvc exp show)")
    results = {}
    for name in names:
        data = found[name]
        metrics = data["metrics"]["reports/cumsum/metrics.json"]["data"]
        positional = data["params"]["params.yaml"]["data"]["cumsum"]["train"]["model"]["positional"]
        results[f"{positional} ({name})"] = {"exact_match": metrics["greedy"]["exact_match"],
                                             "by_length": metrics["by_length"]}
    return results


def write_page(results: dict, setting: str, out: Path):
    fig, ax = plt.subplots(figsize=(8, 4))
    lengths = list(range(1, 25))
    for variant, r in results.items():
        ax.plot(lengths, [r["by_length"][str(n)] for n in lengths], "o-", markersize=3, label=variant)
    ax.axvspan(3.5, 12.5, color="tab:green", alpha=0.1, label="trained lengths")
    ax.set(xlabel="sequence length", ylabel="exact-sequence match", ylim=(-0.02, 1.02), xticks=lengths,
           title=f"cumsum length generalisation by position encoding ({setting})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)
    shorter, longer = range(1, 4), range(13, 25)
    untrained = [*shorter, *longer]

    def cells(shares: dict, lengths) -> str:
        return " | ".join(f"{shares[str(n)]:.2f}" for n in lengths)

    header = "| encoding | 1 | 2 | 3 | test (4-12) | " + " | ".join(map(str, longer)) + " |"
    rule = "|---" * (2 + len(untrained)) + "|"
    rows = [f"| {v} | {cells(r['by_length'], shorter)} | {r['exact_match']:.4f} | {cells(r['by_length'], longer)} |"
            for v, r in results.items()]
    lines = [
        f"# Length generalisation on cumsum ({setting})", "",
        "Trained on lengths 4-12 (default cumsum params otherwise); exact-sequence match of 100 held-out",
        "sequences at each length (fewer at length 1: there are 10), and of the test split. Columns 1-3 and",
        "13-24: lengths never seen in training.", "",
        header, rule, *rows, "", f"![accuracy by length]({out.with_suffix('.png').name})", "",
    ]
    stops = {v: r["stop_errors_by_length"] for v, r in results.items() if "stop_errors_by_length" in r}
    if stops:
        lines += [
            "Share of the sequences at each untrained length whose sums are all right but whose output",
            "stops too early or too late (the rest of the misses have a wrong sum):", "",
            "| encoding | " + " | ".join(map(str, untrained)) + " |", "|---" * (1 + len(untrained)) + "|",
            *(f"| {v} | {cells(shares, untrained)} |" for v, shares in stops.items()),
            "",
        ]
    out.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
