"""Lines of text in, searched or scored outputs back: what the Python API (lib.use.inference) and the command
line (lib.use.generate) share. Input is read as the data was prepared (NFC, stripped); a line the model cannot
read, in whole or in part, is named in a message rather than stopping the others."""

import unicodedata
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from lib.data.tokenizer import decode, encode_sources, special_ids, unknown_note
from lib.evaluate.decode import score_outputs, translate_n_best
from transformer.decoding import Hypothesis


def warn_each(messages: list[str], what: str):
    """Each message a UserWarning naming ``what``, raised where the Python API's caller called it."""
    for message in messages:
        warnings.warn(f"{what}: {message}", stacklevel=3)


def as_list(values, what: str, items: str) -> list:
    """``values``, an iterable (a list, a tuple, a pandas Series, a tensor), as a list; else a TypeError naming
    ``what`` as no str nor list of ``items`` (bytes are not text: decode them first)."""
    if isinstance(values, (bytes, bytearray)) or not isinstance(values, Iterable):
        raise TypeError(f"{what}: a str or a list of {items}, not {type(values).__name__}")
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)


def texts_of(texts, what: str) -> tuple[list[str], bool]:
    """(``texts`` as a list, whether one text was given): a str or an iterable of them, else a TypeError
    naming ``what``."""
    if isinstance(texts, str):
        return [texts], True
    texts = as_list(texts, what, "str")
    if wrong := [i for i, text in enumerate(texts) if not isinstance(text, str)]:
        first = texts[wrong[0]]
        nan = isinstance(first, float) and first != first  # what pandas reads an empty cell as
        raise TypeError(f"{what}[{wrong[0]}]: a str, not {type(first).__name__}"
                        + (f" ({len(wrong)} such in all)" if len(wrong) > 1 else "")
                        + (": NaN, an empty cell as pandas reads it (read_csv(..., keep_default_na=False) keeps it "
                           "'')" if nan else ""))
    return texts, False


def text_of(text, what: str) -> str:
    """``text``, or a TypeError naming ``what`` where it is not one str."""
    if not isinstance(text, str):
        raise TypeError(f"{what}: a str, not {type(text).__name__}")
    return text


def normalized(lines: list[str]) -> list[str]:
    """Lines as the data was prepared: NFC, stripped."""
    return [unicodedata.normalize("NFC", line).strip() for line in lines]


def by_line(i: int) -> str:
    return f"line {i + 1}"


def by_index(i: int) -> str:
    return f"sentences[{i}]"


def read_sources(model, tokenizers, lines: list[str], where=by_line) -> tuple[dict[int, list[int]], list[str]]:
    """The token ids of each line the model can take, by line index, and messages about the lines it
    cannot (longer than its max_len) or reads in part as <unk>, each line named by ``where(index)``.
    Empty lines are left out silently."""
    unk = special_ids(tokenizers).unk
    texts = normalized(lines)
    sources, messages = {}, []
    for i, (text, encoding) in enumerate(zip(texts, encode_sources(tokenizers, texts))):
        if not text:
            continue
        if len(encoding.ids) > model.cfg.max_len:
            messages.append(f"{where(i)}: {len(encoding.ids)} tokens, more than the model's max_len "
                            f"{model.cfg.max_len}; its output is left empty")
            continue
        if note := unknown_note(text, encoding, unk):
            messages.append(f"{where(i)}: {note}")
        sources[i] = encoding.ids
    return sources, messages


Written = dict[int, tuple[list[int], list[Hypothesis]]]  # by line index: its source ids and outputs, best first


def translate_lines(model, tokenizers, lines: list[str], beam_size: int, alpha: float, max_extra_tokens: int,
                    max_tokens: int, n_best: int = 1, where=by_line) -> tuple[list[str], list[str], Written]:
    """One output per line; the messages about the lines left empty or read in part as <unk>; and, by line
    index, each translated line's source ids and its ``n_best`` outputs, best first, with their scores.
    beam_size 1 is greedy search (beam search of one beam is greedy search, scored)."""
    sources, messages = read_sources(model, tokenizers, lines, where)
    keep = sorted(sources)
    outputs = translate_n_best(model, [sources[i] for i in keep], special_ids(tokenizers), max_tokens,
                               max_extra_tokens, beam_size, alpha, n_best)
    translations = [""] * len(lines)
    for i, text in zip(keep, decode(tokenizers.target, [hypotheses[0].tokens for hypotheses in outputs])):
        translations[i] = text
    return translations, messages, {i: (sources[i], hypotheses) for i, hypotheses in zip(keep, outputs)}


def score_lines(model, tokenizers, lines: list[str], references: list[str], alpha: float, max_tokens: int,
                where=by_line, what: str = "the output given") -> tuple[list[str], list[str], Written]:
    """``translate_lines`` for outputs given rather than searched: each reference as the model scores it
    (ending in eos), beside its source line; ``what`` names them in messages."""
    if len(references) != len(lines):
        raise ValueError(f"{len(references)} outputs for {len(lines)} sources: they must be parallel, one output "
                         "per source")
    sources, messages = read_sources(model, tokenizers, lines, where)
    unk = special_ids(tokenizers).unk
    texts, given = normalized(references), sorted(sources)
    outputs = {}
    for i, encoding in zip(given, tokenizers.target.encode_batch([texts[i] for i in given], add_special_tokens=False)):
        if len(encoding.ids) + 1 > model.cfg.max_len:  # with its eos
            messages.append(f"{where(i)}: {what} has {len(encoding.ids)} tokens and an eos, more "
                            f"than the model's max_len {model.cfg.max_len}; not scored")
            continue
        if note := unknown_note(texts[i], encoding, unk):
            messages.append(f"{where(i)}: {what}: {note}")
        outputs[i] = encoding.ids
    keep = sorted(outputs)
    scored = score_outputs(model, [sources[i] for i in keep], [outputs[i] for i in keep], special_ids(tokenizers),
                           max_tokens, alpha)
    shown = [texts[i] if i in outputs else "" for i in range(len(lines))]
    return shown, messages, {i: (sources[i], [h]) for i, h in zip(keep, scored)}


@dataclass(frozen=True)
class Output:
    """A translation with what beam search knows of it."""

    text: str
    score: float  # log_prob / ((5 + tokens) / 6) ** alpha: what beam search ranks by
    log_prob: float  # the model's log-probability of the output (natural log), eos included when it has one
    tokens: int  # its length in tokens, the eos included
    eos: bool  # ended with eos (False: cut at its length limit)
    # Outputs given (``Translator.score``): the token the model found least likely there ("<eos>": the end),
    # and its log-probability; where to look first.
    least_likely: tuple[str, float] | None = None


def outputs_of(tokenizer, hypotheses: list[Hypothesis]) -> list[Output]:
    """Hypotheses as Outputs, their token ids decoded."""
    return [Output(text, h.score, h.log_prob, len(h.tokens) + h.eos, h.eos, least_likely(tokenizer, h))
            for h, text in zip(hypotheses, decode(tokenizer, [h.tokens for h in hypotheses]))]


def least_likely(tokenizer, h: Hypothesis) -> tuple[str, float] | None:
    """The output token the model found least likely, and its log-probability; None where the per-token
    log-probabilities are not known (a search's outputs)."""
    if not h.token_log_probs:
        return None
    j = min(range(len(h.token_log_probs)), key=h.token_log_probs.__getitem__)
    return tokenizer.id_to_token(h.tokens[j]) if j < len(h.tokens) else "<eos>", h.token_log_probs[j]


@dataclass(frozen=True)
class Attention:
    """One kind of attention over a text, every layer and head, as
    ``lib.report.figures.plot_attention_grid(a.layers, a.rows, a.cols, title, path)`` draws it."""

    layers: list[torch.Tensor]  # per layer (H, len(rows), len(cols)): how much each row's position reads each column
    rows: list[str]  # the positions reading: for a decoder, labelled by the token each chose
    cols: list[str]  # the positions read
