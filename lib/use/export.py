"""Export a trained task's model as a folder to take away, laid out as a Hugging Face model repository holds
one, so that `huggingface-cli upload <repo> exports/<task>` publishes it as it is:

    python -m lib.use.export --task cumsum                  # models/cumsum -> exports/cumsum
    python -m lib.use.export --task multi30k --out /tmp/multi30k-model
    python -m lib.use.export --task cumsum --format ctranslate2     # -> exports/cumsum-ctranslate2
    python -m lib.use.export --task multi30k --format transformers  # -> exports/multi30k-transformers

It writes ``model.safetensors`` (the weights alone, no pickle), ``config.json`` (the model config, the
vocabulary sizes and special ids, what model.pt records of its training), the tokenizer's files under
``tokenizer/``, ``generation.json`` (the decoding settings the evaluate stage used), and ``README.md``, a model
card: the task, its data, the training, the metrics with their sacreBLEU signatures, the intended use and the
limits. ``lib.use.inference.load(folder)`` loads it without a torch pickle and decodes as model.pt does.
``--format transformers`` writes a folder for `transformers`' auto classes instead (lib.use.to_transformers).
"""

import argparse
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import yaml

from lib.core.config import flatten
from lib.core.files import atomic_dir
from lib.data.tokenizer import special_ids
from lib.evaluate.options import GENERATION_FILE
from lib.model import checkpoint
from lib.use import exported, to_transformers
from lib.use.families import USES
from lib.report.captions import architecture, model_line
from lib.report.pages import shown_value
from lib.core.text import load_params
from lib.tasks import get_task, task_names
from transformer.model import parameter_counts

TOKENIZER_FILES = ("tokenizer.json", "source.json", "target.json")  # not the token store's ids beside them
CARD = "README.md"
# What an export writes: a folder holding anything else is refused, not replaced (a mistyped --out)
WRITES = (exported.WEIGHTS, exported.CONFIG, "tokenizer", GENERATION_FILE, CARD)


def export(task: str, models: Path, metrics: Path | None, out: Path):
    """``models`` (model.pt, tokenizer/, generation.json) as the folder ``out``, written whole or not at all."""
    model, tokenizers, state = checkpoint.load_directory(models, task=task)  # model.pt, as training wrote it
    scores = read_metrics(metrics)
    with atomic_dir(out, WRITES, "the export") as folder:
        exported.write(model, state, asdict(special_ids(tokenizers)), folder)
        (folder / "tokenizer").mkdir()
        for name in TOKENIZER_FILES:
            if (models / "tokenizer" / name).is_file():
                shutil.copyfile(models / "tokenizer" / name, folder / "tokenizer" / name)
        if (models / GENERATION_FILE).is_file():
            shutil.copyfile(models / GENERATION_FILE, folder / GENERATION_FILE)
        (folder / CARD).write_text(card(task, model, state, scores))


def test_results(task, metrics: dict) -> list[dict]:
    """The model-index's metrics: each search's scores on the test split, with their sacreBLEU signatures."""
    flat, scores = flatten(metrics), get_task(task).scores
    results = []
    for key, value in flat.items():
        search, _, score = key.partition(".")
        if score in scores and search.startswith(("greedy", "beam")):
            entry = {"type": score, "name": f"{score} ({search}, test)", "value": round(float(value), 4)}
            if f"{key}_signature" in flat:
                entry["args"] = {"signature": flat[f"{key}_signature"]}
            results.append(entry)
    if "perplexity" in flat:
        value = round(float(flat["perplexity"]), 4)
        results.append({"type": "perplexity", "name": "perplexity (test)", "value": value})
    return results


# The hub's id of a task's data and its languages, for the card: kept here, not in lib/tasks, whose every edit
# reruns the stages. A translation task's languages are its prepare section's (multi30k runs either way).
HUB_DATA = {"multi30k": "bentrevett/multi30k", "wmt14": "wmt/wmt14", "shakespeare": "karpathy/tiny_shakespeare"}
LANGUAGES = {"shakespeare": ["en"]}


def languages(task: str) -> list[str]:
    """ISO 639-1 codes of what the task reads and writes: none for a synthetic one, or where params.yaml is
    not there to say."""
    try:
        prepare = load_params().get(task, {}).get("prepare", {})
    except (OSError, ValueError):
        prepare = {}
    sides = [prepare[side] for side in ("src_lang", "tgt_lang") if side in prepare]
    return sides or LANGUAGES.get(task, [])


def metadata(task: str, metrics: dict, library: str) -> dict:
    """The hub's metadata block: the library that loads the folder, the task's languages and data, and a
    ``model-index`` of the test metrics."""
    chosen, dataset = get_task(task), HUB_DATA.get(task, "")
    kind = USES[chosen.family].pipeline_tag
    results = test_results(task, metrics)
    block = {"license": "mit", "library_name": library, "pipeline_tag": kind,
             "tags": ["transformer", "from-scratch", "pytorch"], "language": languages(task),
             "datasets": [dataset] if dataset else [],
             "model-index": [{"name": task, "results": [
                 {"task": {"type": kind, "name": kind},
                  "dataset": {"name": task, "type": dataset or task, "split": "test"},
                  "metrics": results}]}] if results else []}
    return {key: value for key, value in block.items() if value != []}


# How the toolkit's own folder is loaded, for its card's "Use" (a transformers folder's: its family's)
USE_LINES = ("```python", "from lib.use import inference  # the toolkit's code, on the path",
             'model = inference.load("path/to/this/folder")  # model.safetensors, config.json, tokenizer/', "```", "",
             "`generation.json` holds the decoding settings the metrics were measured with, the loader's defaults.")


def read_metrics(path: Path | None) -> dict:
    return json.loads(path.read_text()) if path and path.is_file() else {}


def card(task: str, model, state: dict, metrics: dict, library: str = "pytorch") -> str:
    """README.md: the model card, with the Hugging Face hub's metadata block first. ``library``: pytorch (this
    toolkit's folder) or transformers (a Marian or GPT-2 folder)."""
    chosen = get_task(task)
    flat = {key: value for key, value in flatten(metrics).items() if not key.endswith("by_length")}
    scores = [f"| {key} | {shown_value(value)} |" for key, value in flat.items() if not key.endswith("signature")]
    signatures = [f"- {key}: `{value}`" for key, value in flat.items() if key.endswith("signature")]
    use = USE_LINES if library == "pytorch" else USES[chosen.family].transformers_use
    block = yaml.safe_dump(metadata(task, metrics, library), sort_keys=False, allow_unicode=True, width=1000)
    return "\n".join([
        "---", block.rstrip("\n"), "---", "",
        f"# {task}: {chosen.description}", "",
        f"A Transformer (Vaswani et al., 2017) written by hand in PyTorch and trained by this toolkit's DVC "
        f"pipeline. {architecture(model.cfg, state)} {parameter_counts(model)['total']:,} parameters.", "",
        "## Training", "", model_line(state), "",
        "The data, the params and the recipe are those of the task's section of the toolkit's `params.yaml` "
        f"and `docs/tasks.md` (`{task}`).", "",
        "## Metrics", "", "On the task's test split, as the evaluate stage measured them:", "",
        "| metric | value |", "|---|---|", *(scores or ["| (no metrics.json given) | |"]), "", *signatures, "",
        "## Use", "", *use, "",
        "## Intended use and limits", "",
        "For learning and experiments: a model of this size, trained on this task's data alone, is no "
        "production system. It reads only what its tokenizer knows (other words become `<unk>`) and at most "
        f"{model.cfg.max_len} tokens a sequence; its outputs are unchecked and may be wrong or biased as its "
        "training data is.", ""])


FORMATS = ("huggingface", "transformers", "ctranslate2")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lib.use.export", description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, choices=task_names())
    parser.add_argument("--models", help="model.pt and tokenizer/ (default: models/<task>)")
    parser.add_argument("--metrics", help="its metrics.json, for the card (default: reports/<task>/metrics.json)")
    parser.add_argument("--out", help="the folder to write (default: exports/<task>, exports/<task>-<format>)")
    parser.add_argument("--format", choices=FORMATS, default="huggingface",
                        help="huggingface: safetensors, config and card, for this toolkit's loader; transformers: "
                        "a Marian (translation) or GPT-2 (LM) folder for transformers' auto classes; ctranslate2: "
                        "a CTranslate2 model directory")
    parser.add_argument("--alpha", type=float, help="ctranslate2: the length penalty to decode with, in place of "
                        "generation.json's (CTranslate2 has no GNMT penalty: 0 is the one it can express)")
    args = parser.parse_args(argv)
    models = Path(args.models or f"models/{args.task}").expanduser()
    metrics = Path(args.metrics or f"reports/{args.task}/metrics.json").expanduser()
    out = Path(args.out or (f"exports/{args.task}" if args.format == "huggingface"
                            else f"exports/{args.task}-{args.format}")).expanduser()
    try:
        if args.format == "huggingface":
            export(args.task, models, metrics, out)
        elif args.format == "transformers":
            to_transformers.export(args.task, models, out, lambda model, state: card(
                args.task, model, state, read_metrics(metrics), "transformers"), USES)
        else:
            from lib.use import to_ctranslate2  # ctranslate2 loads only for this format

            to_ctranslate2.export(args.task, models, out, args.alpha)
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"export: error: {err}\n")
    print(f"exported {args.task} to {out}")


if __name__ == "__main__":
    main()
