"""Tokenizers trained and loaded through HF ``tokenizers``; special ids come from here.

The tokenize stage writes a directory: ``tokenizer.json`` for a joint
vocabulary (and for language models), or ``source.json`` and ``target.json``
for one vocabulary per language. No other module knows a token id:
pad/bos/eos/unk are read from the saved files by name, and both sides give
them the same ids.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow.parquet as pq
import torch
from tokenizers import Encoding, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from lib.core.sections import TokenizeConfig
from lib.data.pairs import Pairs, SpecialIds, split_path
from lib.core.files import first_few, not_as_written
from lib.data.token_store import write_pairs

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
JOINT, SOURCE, TARGET = "tokenizer.json", "source.json", "target.json"


def train_tokenizer(cfg: TokenizeConfig, texts: Iterable[str]) -> Tokenizer:
    """Learn a vocabulary from ``texts`` (the training split, never valid/test).

    word: whitespace-separated words, decoded joined by spaces. char: every
    character (newlines and spaces included) a token, decoded by concatenation.
    bpe: byte-pair merges up to ``vocab_size`` over Metaspace pieces, so that
    decoding restores the spaces exactly; with ``split_punctuation`` each
    punctuation mark is a piece of its own, so that "dog." is "▁dog" "." and
    not a token apart from "▁dog" (decoding still restores the text exactly).
    """
    if cfg.kind == "word":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.WordLevelTrainer(
            min_frequency=cfg.min_frequency, special_tokens=SPECIAL_TOKENS, show_progress=False
        )
    elif cfg.kind == "char":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?m)."), behavior="isolated")  # (?m): . matches \n
        tokenizer.decoder = decoders.Fuse()
        trainer = trainers.WordLevelTrainer(
            min_frequency=cfg.min_frequency, special_tokens=SPECIAL_TOKENS, show_progress=False
        )
    else:  # bpe
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        if cfg.split_punctuation:
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence([tokenizer.pre_tokenizer, pre_tokenizers.Punctuation()])
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, special_tokens=SPECIAL_TOKENS,
            show_progress=False,
        )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


@dataclass(frozen=True)
class Tokenizers:
    """The source and the target side's tokenizers: one object twice for a joint vocabulary."""

    source: Tokenizer
    target: Tokenizer

    @property
    def joint(self) -> bool:
        return self.source is self.target


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: tokenizer not found (run the tokenize stage first)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception for a bad file
        raise not_as_written(path, f"not a readable tokenizer ({err})", "tokenize") from None


def load_tokenizers(directory: str | Path) -> Tokenizers:
    """What the tokenize stage wrote into ``directory``: joint, or one tokenizer per side."""
    directory = Path(directory)
    if (directory / JOINT).is_file() or not (directory / SOURCE).is_file():
        joint = load_tokenizer(directory / JOINT)
        special_ids(joint)
        return Tokenizers(joint, joint)
    tokenizers = Tokenizers(load_tokenizer(directory / SOURCE), load_tokenizer(directory / TARGET))
    if special_ids(tokenizers.source) != special_ids(tokenizers.target):
        raise ValueError(f"{directory}: {SOURCE} and {TARGET} give the special tokens different ids")
    return tokenizers


def special_ids(tokenizer: "Tokenizer | Tokenizers") -> SpecialIds:
    if isinstance(tokenizer, Tokenizers):
        tokenizer = tokenizer.target  # load_tokenizers checked that both sides agree
    ids = {name: tokenizer.token_to_id(token) for name, token in zip(("pad", "bos", "eos", "unk"), SPECIAL_TOKENS)}
    missing = [SPECIAL_TOKENS[i] for i, v in enumerate(ids.values()) if v is None]
    if missing:
        raise ValueError(f"tokenizer lacks the special tokens {missing}")
    return SpecialIds(**ids)


def encode(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids without specials; the data code adds bos/eos where it needs them."""
    return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def unknown_words(text: str, encoding: Encoding, unk: int) -> list[str]:
    """The stretches of ``text`` that its ``encoding`` reads as <unk> (id ``unk``), in order, adjacent ones joined."""
    spans = []
    for token, (start, end) in zip(encoding.ids, encoding.offsets):
        if token == unk:
            if spans and spans[-1][1] == start:
                start = spans.pop()[0]
            spans.append((start, end))
    return [text[start:end] for start, end in spans]


def unknown_note(text: str, encoding, unk: int) -> str | None:
    """What of ``text`` the model cannot read (its ``encoding`` has <unk> there), for a message."""
    words = unknown_words(text, encoding, unk)
    if not words:
        return None
    return f"not in the model's vocabulary, read as <unk>: {first_few(map(repr, words))}"


def lm_ids(tokenizers, text: str, what: str) -> tuple[list[int], list[str]]:
    """The LM's token ids of ``text``, and a message naming what it cannot read (<unk>), as part of ``what``."""
    encoding = tokenizers.target.encode(text, add_special_tokens=False)
    note = unknown_note(text, encoding, special_ids(tokenizers).unk)
    return encoding.ids, [f"{what}: {note}"] if note else []


def encode_sources(tokenizers: Tokenizers, texts: list[str]) -> list[Encoding]:
    """Sources as the model reads them: ending in <eos> where the tokenize stage said so (``source_eos``).

    The source side's post-processor adds it, so the tokenizer file, not the
    calling code, decides; targets are encoded without specials."""
    return tokenizers.source.encode_batch(texts, add_special_tokens=True)


def encode_pairs(tokenizers: Tokenizers, frame) -> Pairs:
    """A parallel split (columns src, tgt) as token ids."""
    sources = [e.ids for e in encode_sources(tokenizers, frame["src"].tolist())]
    return Pairs(sources, encode(tokenizers.target, frame["tgt"].tolist()))


def encode_text(tokenizer: Tokenizer, text: str) -> torch.Tensor:
    """A whole text (a language-modelling split, a passage) as one sequence of ids: (N,)."""
    return torch.tensor(encode(tokenizer, [text])[0], dtype=torch.long)


def decode(tokenizer: Tokenizer, ids: list[list[int]]) -> list[str]:
    return tokenizer.decode_batch(ids, skip_special_tokens=True)


def continuation(tokenizer: Tokenizer, ids: list[int], tokens: Iterable[int], context: int = 8) -> Iterator[str]:
    """The text that ``tokens`` add after ``ids`` (a prompt's), piece by piece as they come; each token is
    appended to ``ids``. A piece is what the decoded text gains with the token, read in a window of the
    ``context`` tokens before it (so a long prompt costs nothing): the new tokens decoded alone would lose
    the space a Metaspace decoder drops at a text's start ("ROMEO" + "▁said" is "ROMEO said", but "▁said"
    alone is "said"). A token that changes the text before it (none of ours does) waits for one that does
    not."""
    given = len(ids)  # the tokens whose text has been given
    for token in tokens:
        ids.append(token)
        start = max(0, given - context)
        before, text = tokenizer.decode(ids[start:given]), tokenizer.decode(ids[start:])
        if text.startswith(before):
            if piece := text[len(before):]:
                yield piece
            given = len(ids)


def write_splits(tokenizers: Tokenizers, data_dir: str | Path, out_dir: str | Path,
                 splits: tuple[str, ...] = ("train", "valid"), batch_rows: int = 100_000) -> dict:
    """Each split of ``data_dir`` encoded a batch of rows at a time and written to ``out_dir`` as a token store
    (``lib.data.token_store``), never whole in memory."""
    counts = {}
    for split in splits:
        file = pq.ParquetFile(split_path(data_dir, split))
        chunks = (encode_pairs(tokenizers, batch.to_pandas())
                  for batch in file.iter_batches(batch_size=batch_rows, columns=["src", "tgt"]))
        counts[split] = write_pairs(chunks, out_dir, split)
    return counts
