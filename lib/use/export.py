"""Export a trained task's model as a folder to take away, laid out as a Hugging Face model repository holds
one, so that `huggingface-cli upload <repo> exports/<task>` publishes it as it is:

    python -m lib.use.export --task cumsum                  # models/cumsum -> exports/cumsum
    python -m lib.use.export --task multi30k --out /tmp/multi30k-model
    python -m lib.use.export --task cumsum --format ctranslate2     # -> exports/cumsum-ctranslate2

It writes ``model.safetensors`` (the weights alone, no pickle), ``config.json`` (the model config, the
vocabulary sizes and special ids, what model.pt records of its training), the tokenizer's files under
``tokenizer/``, ``generation.json`` (the decoding settings the evaluate stage used), and ``README.md``, a model
card: the task, its data, the training, the metrics with their sacreBLEU signatures, the intended use and the
limits. ``lib.use.inference.load(folder)`` loads it without a torch pickle and decodes as model.pt does.
"""

import argparse
import json
import shutil
from dataclasses import asdict
from pathlib import Path

from lib.core.config import flatten
from lib.core.files import atomic_dir
from lib.data.tokenizer import special_ids
from lib.evaluate.options import GENERATION_FILE
from lib.model import checkpoint
from lib.use import exported
from lib.use.families import USES
from lib.report.captions import architecture, model_line
from lib.report.pages import shown_value
from lib.tasks import get_task, task_names
from transformer.model import parameter_counts

TOKENIZER_FILES = ("tokenizer.json", "source.json", "target.json")  # not the token store's ids beside them
CARD = "README.md"
# What an export writes: a folder holding anything else is refused, not replaced (a mistyped --out)
WRITES = (exported.WEIGHTS, exported.CONFIG, "tokenizer", GENERATION_FILE, CARD)


def export(task: str, models: Path, metrics: Path | None, out: Path):
    """``models`` (model.pt, tokenizer/, generation.json) as the folder ``out``, written whole or not at all."""
    model, tokenizers, state = checkpoint.load_directory(models, task=task)  # model.pt, as training wrote it
    scores = json.loads(metrics.read_text()) if metrics and metrics.is_file() else {}
    with atomic_dir(out, WRITES, "the export") as folder:
        exported.write(model, state, asdict(special_ids(tokenizers)), folder)
        (folder / "tokenizer").mkdir()
        for name in TOKENIZER_FILES:
            if (models / "tokenizer" / name).is_file():
                shutil.copyfile(models / "tokenizer" / name, folder / "tokenizer" / name)
        if (models / GENERATION_FILE).is_file():
            shutil.copyfile(models / GENERATION_FILE, folder / GENERATION_FILE)
        (folder / CARD).write_text(card(task, model, state, scores))


def card(task: str, model, state: dict, metrics: dict) -> str:
    """README.md: the model card, with the Hugging Face hub's metadata block first."""
    chosen = get_task(task)
    kind = USES[chosen.family].pipeline_tag
    flat = {key: value for key, value in flatten(metrics).items() if not key.endswith("by_length")}
    scores = [f"| {key} | {shown_value(value)} |" for key, value in flat.items() if not key.endswith("signature")]
    signatures = [f"- {key}: `{value}`" for key, value in flat.items() if key.endswith("signature")]
    return "\n".join([
        "---", "license: mit", f"pipeline_tag: {kind}", "tags: [transformer, from-scratch, pytorch]", "---", "",
        f"# {task}: {chosen.description}", "",
        f"A Transformer (Vaswani et al., 2017) written by hand in PyTorch and trained by this toolkit's DVC "
        f"pipeline. {architecture(model.cfg, state)} {parameter_counts(model)['total']:,} parameters.", "",
        "## Training", "", model_line(state), "",
        "The data, the params and the recipe are those of the task's section of the toolkit's `params.yaml` "
        f"and `docs/tasks.md` (`{task}`).", "",
        "## Metrics", "", "On the task's test split, as the evaluate stage measured them:", "",
        "| metric | value |", "|---|---|", *(scores or ["| (no metrics.json given) | |"]), "", *signatures, "",
        "## Use", "", "```", "from lib.use import inference  # the toolkit's code, on the path",
        'model = inference.load("path/to/this/folder")  # model.safetensors, config.json, tokenizer/',
        "```", "",
        "`generation.json` holds the decoding settings the metrics were measured with, the loader's defaults.", "",
        "## Intended use and limits", "",
        "For learning and experiments: a model of this size, trained on this task's data alone, is no "
        "production system. It reads only what its tokenizer knows (other words become `<unk>`) and at most "
        f"{model.cfg.max_len} tokens a sequence; its outputs are unchecked and may be wrong or biased as its "
        "training data is.", ""])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lib.use.export", description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, choices=task_names())
    parser.add_argument("--models", help="model.pt and tokenizer/ (default: models/<task>)")
    parser.add_argument("--metrics", help="its metrics.json, for the card (default: reports/<task>/metrics.json)")
    parser.add_argument("--out", help="the folder to write (default: exports/<task>, exports/<task>-ctranslate2)")
    parser.add_argument("--format", choices=("huggingface", "ctranslate2"), default="huggingface",
                        help="huggingface: safetensors, config and card; ctranslate2: a CTranslate2 model directory")
    parser.add_argument("--alpha", type=float, help="ctranslate2: the length penalty to decode with, in place of "
                        "generation.json's (CTranslate2 has no GNMT penalty: 0 is the one it can express)")
    args = parser.parse_args(argv)
    models = Path(args.models or f"models/{args.task}").expanduser()
    out = args.out or (f"exports/{args.task}" if args.format == "huggingface" else f"exports/{args.task}-ctranslate2")
    try:
        if args.format == "huggingface":
            export(args.task, models, Path(args.metrics or f"reports/{args.task}/metrics.json").expanduser(),
                   Path(out).expanduser())
        else:
            from lib.use import to_ctranslate2  # ctranslate2 loads only for this format

            to_ctranslate2.export(args.task, models, Path(out).expanduser(), args.alpha)
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"export: error: {err}\n")
    print(f"exported {args.task} to {out}")


if __name__ == "__main__":
    main()
