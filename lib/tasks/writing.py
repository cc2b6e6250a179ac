"""The data stages, fetch, prepare and tokenize: each asks its task for the data, then writes it whole."""

from pathlib import Path

from tokenizers import processors

from lib.core.sections import TokenizeConfig
from lib.core.files import atomic_dir
from lib.data.sources import write_manifest
from lib.data.tokenizer import EOS, JOINT, SOURCE, TARGET, Tokenizers, special_ids, train_tokenizer, write_splits
from lib.tasks import get_task
from lib.tasks.outputs import holds


def run_fetch(task: str, cfg, out_dir: str | Path):
    """The task's source files and their manifest into a fresh directory, replacing ``out_dir`` only when all
    are in: a failed or cut download leaves the last whole one, or nothing."""
    chosen = get_task(task)
    with atomic_dir(out_dir, holds(chosen, "fetch", "out"), "the fetch stage") as tmp:
        files = chosen.fetch(cfg, tmp)
        write_manifest(tmp, getattr(cfg, "source", "none: the prepare stage makes the data"), files)


def run_prepare(task: str, cfg, out_dir: str | Path, source_dir: str | Path | None = None):
    """Write the task's data, from the files fetch put in ``source_dir``, into a fresh directory, replacing
    ``out_dir`` only when complete."""
    chosen = get_task(task)
    with atomic_dir(out_dir, holds(chosen, "prepare", "out"), "the prepare stage") as tmp:
        chosen.prepare(cfg, tmp, None if source_dir is None else Path(source_dir))


def run_tokenize(task: str, cfg: TokenizeConfig, data_dir: str | Path, out_dir: str | Path) -> Tokenizers:
    """The tokenize stage: learn from the task's training text only, save into ``out_dir``."""
    chosen = get_task(task)
    if chosen.one_vocabulary(cfg):
        joint = train_tokenizer(cfg, chosen.tokenizer_texts(cfg, data_dir, "both"))
        files, tokenizers = {JOINT: joint}, Tokenizers(joint, joint)
    else:
        tokenizers = Tokenizers(*(train_tokenizer(cfg, chosen.tokenizer_texts(cfg, data_dir, side))
                                  for side in ("source", "target")))
        files = {SOURCE: tokenizers.source, TARGET: tokenizers.target}
    for tokenizer in files.values():
        special_ids(tokenizer)
    if cfg.source_eos:
        eos = (EOS, tokenizers.source.token_to_id(EOS))
        tokenizers.source.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[eos])
    with atomic_dir(out_dir, holds(chosen, "tokenize", "out"), "the tokenize stage") as tmp:
        for name, tokenizer in files.items():
            tokenizer.save(str(tmp / name))
        if chosen.token_store:  # a corpus of millions: its ids written once, for train to map
            write_splits(tokenizers, data_dir, tmp)
    return tokenizers
