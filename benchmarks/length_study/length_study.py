"""Length generalisation on cumsum: train on lengths 4-12, exact match at every length 1-24,
once per position encoding (and Post-LN / Pre-LN).

Run from the repository root with the venv active:
    PYTHONPATH=. python benchmarks/length_study/length_study.py [--variants sinusoidal learned rope alibi]
It uses the cumsum params of params.yaml, changing only the position encoding
(and, with --norm-first, Post-LN to Pre-LN), runs every stage's `run` in a
temporary directory, prints one JSON object and writes <out>.md and <out>.png
(default benchmarks/length_study/pages/length_study.*, which git ignores). The page also says how many of the
sequences at each untrained length have every sum right and miss only where
the output stops. With --modulus 10 the targets are the sums' last digits, so
that longer sequences ask for no sum that training rarely saw (see
lib/tasks/cumsum.py): the positions alone are then tested. Add --set
model.tie_embeddings=false there: tied, the model starts out repeating its input
and some encodings never learn even the trained lengths (benchmarks/length_study/tie_start.py). --no-source-eos
trains without the <eos> that ends each source (tokenize.source_eos). A variant
may carry model params of its own (rope,rope_base=1000000), and --set reaches
the other stages' params too (prepare.vocab_length=40: study lengths 1-40).
The same study through DVC experiments, one queued run of the whole pipeline
per encoding, then this page from their metrics:
    for p in sinusoidal learned rope alibi; do
      dvc exp run --queue -n pos-$p -S cumsum.train.model.positional=$p; done
    dvc queue start && dvc queue status        # until all four are done
    PYTHONPATH=. python benchmarks/length_study/length_study.py \
        --from-exps pos-sinusoidal pos-learned pos-rope pos-alibi
"""

import argparse
import copy
import io
import json
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after matplotlib.use: the backend is set before pyplot loads

from lib.evaluate import by_length, evaluation
from lib.evaluate.evaluation import EvaluatePaths
from lib.tasks.writing import run_tokenize
from lib.train import training  # noqa: E402 - after matplotlib.use, as the imports above
from lib.core.config import ConfigError
from lib.core.text import load_params, parse_yaml
from lib.tasks.params import stage_config  # noqa: E402 - after matplotlib.use, as the imports above
from lib.tasks import cumsum  # noqa: E402 - after matplotlib.use, as the imports above
from lib.tasks.writing import run_prepare
from tools.results import header

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["sinusoidal", "learned", "rope", "alibi"],
                        help="position encodings, each optionally with model params of its own: "
                             "rope,rope_base=1000")
    parser.add_argument("--norm-first", action="store_true", help="Pre-LN instead of the params' choice")
    parser.add_argument("--modulus", type=int, default=None,
                        help="cumsum.prepare.modulus for the data (10: targets are the sums' last digits)")
    parser.add_argument("--source-eos", action=argparse.BooleanOptionalAction,
                        help="cumsum.tokenize.source_eos, whether every source ends in <eos> (default: the params')")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override cumsum.train params for every variant, e.g. model.dropout=0.0 "
                             "label_smoothing=0; or another stage's: prepare.vocab_length=40 (study lengths 1-40)")
    parser.add_argument("--out", default=str(HERE / "pages" / "length_study"),
                        help="stem of the .md and .png written (default: in pages/, kept out of git)")
    parser.add_argument("--from-exps", nargs="+", metavar="NAME",
                        help="read these DVC experiments' metrics (dvc exp show) instead of training")
    args = parser.parse_args()
    params = load_params(ROOT / "params.yaml")
    if args.from_exps:
        results = experiment_results(args.from_exps)
        write_page(results, "DVC experiments " + ", ".join(args.from_exps), stage_config(params, "cumsum", "prepare"),
                   Path(args.out))
        print(json.dumps({**header("length_study"), "results": results}, indent=2))
        return
    for item in args.set:
        section = [] if item.split(".")[0] in ("prepare", "tokenize", "evaluate") else ["train"]
        override(params, ["cumsum", *section], item, parser)
    if args.modulus is not None:
        params["cumsum"]["prepare"]["modulus"] = args.modulus
    if args.source_eos is not None:
        params["cumsum"]["tokenize"]["source_eos"] = args.source_eos
    if args.norm_first:
        params["cumsum"]["train"]["model"]["norm_first"] = True
    try:  # every variant's params are checked, as params.yaml is, before any work
        cfg = {stage: stage_config(params, "cumsum", stage) for stage in ("prepare", "tokenize", "evaluate")}
        train_cfgs = {variant: stage_config(variant_params(params, variant, parser), "cumsum", "train")
                      for variant in args.variants}
    except ConfigError as error:
        parser.error(str(error))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_prepare("cumsum", cfg["prepare"], tmp / "data")
        run_tokenize("cumsum", cfg["tokenize"], tmp / "data", tmp / "tok")
        for variant, train_cfg in train_cfgs.items():
            run_dir = tmp / f"run{len(results)}"
            start = time.perf_counter()
            training.run("cumsum", train_cfg, tmp / "data", tmp / "tok", run_dir / "model.pt",
                         run_dir / "ckpt", run_dir / "live")
            seconds = time.perf_counter() - start
            metrics = evaluation.run("cumsum", cfg["evaluate"], EvaluatePaths(
                data=tmp / "data", tokenizer=tmp / "tok", model=run_dir / "model.pt", metrics=run_dir /
                "metrics.json", samples=run_dir / "samples.jsonl", lengths=run_dir / "by_length.csv"))
            results[variant] = {"train_s": round(seconds, 1), "exact_match": metrics["greedy"]["exact_match"],
                                "by_length": read_by_length((run_dir / "by_length.csv").read_text()),
                                "stop_errors_by_length": stop_errors(run_dir / "samples.jsonl")}
    setting = "Pre-LN" if params["cumsum"]["train"]["model"]["norm_first"] else "Post-LN"
    if cfg["prepare"].modulus:
        setting += f", sums modulo {cfg['prepare'].modulus}"
    setting += ", sources end in <eos>" if cfg["tokenize"].source_eos else ", no <eos> on sources"
    if args.set:
        setting += ", " + ", ".join(args.set)
    write_page(results, setting, cfg["prepare"], Path(args.out))
    print(json.dumps({**header("length_study"), "setting": setting,
                      "results": results}, indent=2))


def variant_params(params: dict, variant: str, parser: argparse.ArgumentParser) -> dict:
    """The params with a variant's model params: "rope" sets positional, "rope,rope_base=1000" rope_base too."""
    positional, *model_sets = variant.split(",")
    params = copy.deepcopy(params)
    for item in [f"positional={positional}", *model_sets]:
        override(params, ["cumsum", "train", "model"], item, parser)
    return params


def override(params: dict, section: list[str], item: str, parser: argparse.ArgumentParser):
    """Set params[section...][KEY...] from ``item``, "KEY=VALUE" with a dotted KEY; the value is read as YAML
    (1000 a number, false a bool). A new key is let through here: stage_config then names it as unknown."""
    key, equals, value = item.partition("=")
    if not equals or not key:
        parser.error(f"{item!r}: expected KEY=VALUE")
    *parents, last = [*section, *key.split(".")]
    node = params
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            parser.error(f"{item!r}: {'.'.join(parents)} is not a section of params.yaml")
    try:  # as DVC reads -S values: 3e-4 a number, yes a word
        node[last] = parse_yaml(value, f"--set {item!r}")
    except ConfigError as err:
        parser.error(str(err))


def stop_errors(samples_path: Path) -> dict:
    """{"early": {"01": share of the length-1 sequences whose every sum is right but whose output stops
    too early, ...}, "late": {... stops too late}}: the misses at a length that are about where the output ends.
    The outputs are those the evaluate stage scored (samples.jsonl's length-study rows)."""
    samples = pd.read_json(samples_path, lines=True, dtype=False)
    study = samples[samples["split"] == cumsum.Cumsum.extra_split]
    stops = [wrong_stop(h.split(), r.split()) for h, r in zip(study["greedy"], study["reference"])]
    return {side: by_length.share_by_length(study["source"].tolist(), [stop == side for stop in stops])
            for side in ("early", "late")}


def wrong_stop(hypothesis: list[str], reference: list[str]) -> str | None:
    """Which way the output stops wrong: "early" or "late" when every token the two share is right and the
    lengths differ (the reference is longer, or shorter); None when it stops right or a sum is wrong."""
    if len(hypothesis) == len(reference) or any(h != r for h, r in zip(hypothesis, reference)):
        return None
    return "early" if len(hypothesis) < len(reference) else "late"


def experiment_results(names: list[str]) -> dict:
    """{positional: {"exact_match", "by_length"}} of the named experiments, from `dvc exp show --json`."""
    shown = json.loads(subprocess.run(["dvc", "exp", "show", "--json"], capture_output=True, text=True,
                                      check=True, cwd=ROOT).stdout)
    found = {}

    def walk(node):  # experiments nest under their baseline commit: look everywhere
        if isinstance(node, dict):
            if node.get("name") in names and isinstance(node.get("data"), dict):
                found[node["name"]] = node
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
        data = found[name]["data"]
        metrics = data["metrics"]["reports/cumsum/metrics.json"]["data"]
        positional = data["params"]["params.yaml"]["data"]["cumsum"]["train"]["model"]["positional"]
        table = subprocess.run(["git", "show", f"{found[name]['rev']}:reports/cumsum/by_length.csv"],
                               capture_output=True, text=True, check=True, cwd=ROOT).stdout
        results[f"{positional} ({name})"] = {"exact_match": metrics["greedy"]["exact_match"],
                                             "by_length": read_by_length(table)}
    return results


def read_by_length(table: str) -> dict[int, float]:
    """by_length.csv, the evaluate stage's exact match by length, as {length: share}."""
    frame = pd.read_csv(io.StringIO(table))
    return dict(zip(frame["length"].astype(int), frame["exact_match"]))


def write_page(results: dict, setting: str, prepare, out: Path):
    """<out>.md and <out>.png: exact match at every study length, marking the trained ones (``prepare``'s:
    with --from-exps, those of params.yaml here, not each experiment's)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lo, hi = prepare.min_length, prepare.max_length
    exact = {v: by_length.lengths_as_numbers(r["by_length"]) for v, r in results.items()}
    stops = {v: {side: by_length.lengths_as_numbers(shares) for side, shares in r["stop_errors_by_length"].items()}
             for v, r in results.items() if "stop_errors_by_length" in r}
    lengths = sorted(next(iter(exact.values())))
    width = max(8, len(lengths) / 3)  # inches
    fig, ax = plt.subplots(figsize=(width, 4))
    for variant, shares in exact.items():
        ax.plot(lengths, [shares[n] for n in lengths], "o-", markersize=3, label=variant)
    ax.axvspan(lo - 0.5, hi + 0.5, color="tab:green", alpha=0.1, label="trained lengths")
    ax.set(xlabel="sequence length", ylabel="exact-sequence match", ylim=(-0.02, 1.02), xticks=lengths,
           title=textwrap.fill(f"cumsum length generalisation by position encoding ({setting})",
                               int(width * 9)))  # a long setting wraps rather than running off the image
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)
    shorter, longer = [n for n in lengths if n < lo], [n for n in lengths if n > hi]
    untrained = [*shorter, *longer]

    def stop(sides: dict, n: int) -> str:  # "0.40 early", "0.10 late", both, or 0.00
        return " ".join(f"{sides[side][n]:.2f} {side}" for side in ("early", "late") if sides[side][n] > 0) or "0.00"

    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(head) + " |", "|---" * len(head) + "|", *("| " + " | ".join(r) + " |" for r in rows)]

    spans = " and ".join(f"{span[0]}-{span[-1]}" for span in (shorter, longer) if span)
    lines = [
        f"# Length generalisation on cumsum ({setting})", "",
        f"Trained on lengths {lo}-{hi} (default cumsum params otherwise); exact-sequence match of",
        f"{prepare.n_per_length} held-out sequences at each length (fewer where fewer exist: 10 of",
        f"length 1), and of the test split. Columns {spans}: lengths never seen in training.", "",
        *table(["encoding", *map(str, shorter), f"test ({lo}-{hi})", *map(str, longer)],
               [[v, *(f"{exact[v][n]:.2f}" for n in shorter), f"{r['exact_match']:.4f}",
                 *(f"{exact[v][n]:.2f}" for n in longer)] for v, r in results.items()]),
        "", f"![accuracy by length]({out.with_suffix('.png').name})", "",
    ]
    if stops:
        lines += [
            "Share of the sequences at each untrained length whose sums are all right but whose output",
            "stops too early or too late (the rest of the misses have a wrong sum):", "",
            *table(["encoding", *map(str, untrained)], [[v, *(stop(sides, n) for n in untrained)]
                                                         for v, sides in stops.items()]),
            "",
        ]
    out.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
