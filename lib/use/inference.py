"""A trained model from Python: load it once, then translate, sample, score, or read its attention.

    from lib.use.inference import load
    translator = load("models/multi30k")        # what `dvc repro` wrote there: model.pt and tokenizer/
    translator.translate("Ein Hund rennt über die Wiese.", beam_size=5)      # 'A dog runs through the grass.'
    translator.n_best("Zwei Hunde spielen im Schnee.", k=3, beam_size=5)    # [Output(text=..., score=...), ...]
    translator.score("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow.")
    translator.attention("Zwei Hunde spielen im Schnee.")   # {"cross-attention": Attention(layers, rows, cols), ...}

    lm = load("models/shakespeare")
    lm.sample("ROMEO:", max_new_tokens=300, top_k=40, seed=1)
    for piece in lm.stream("ROMEO:"): print(piece, end="", flush=True)    # a continuation, as it is drawn
    lm.score(text)                  # {"tokens": ..., "loss": ..., "perplexity": ..., "bits_per_char": ...}

Each method takes one text (and returns one result) or a list of them (and returns a list). Input is read
as the data was prepared (NFC, stripped). What the model can read only in part (words or characters its
vocabulary lacks, read as <unk>) or not at all (a source longer than its ``max_len``: its output is left
empty) is a ``UserWarning`` naming the text, so that one bad sentence never stops a list; an option out of
range is a ``ValueError`` naming it, and one of the wrong type (``beam_size=2.0``, ``temperature="0.8"``, bytes
for a text) a ``TypeError`` naming it. ``python -m lib.use.generate`` is the command line over these functions.
"""

import numbers
import unicodedata
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from lib.model import checkpoint
from lib.data.pairs import Pairs, collate
from transformer.greedy import Hypothesis
from transformer.sampling import sampled
from lib.evaluate.decode import score_outputs, translate_n_best
from lib.core.distributed import device_named
from lib.evaluate.evaluation import text_metrics
from lib.data.tokenizer import continuation, decode, encode_sources, lm_ids, special_ids, unknown_note

# What each option must be, by keyword: its type, then its range. One table for this module's methods and for
# lib.use.generate's flags (argparse has given those their type).
INTEGER, NUMBER = (numbers.Integral, "an integer"), (numbers.Real, "a number")
# Upper bounds where memory and time grow with the value: a step of beam search scores beam x vocabulary
# candidates.
MOST_BEAM, MOST_NEW_TOKENS, MOST_SAMPLES = 1000, 100_000, 1000
RANGES = {
    "beam_size": (INTEGER, lambda v: 1 <= v <= MOST_BEAM, f"in [1, {MOST_BEAM}] (1: greedy)"),
    "k": (INTEGER, lambda v: 1 <= v <= MOST_BEAM, f"in [1, {MOST_BEAM}]"),
    "alpha": (NUMBER, lambda v: v >= 0, ">= 0"),
    "max_extra_tokens": (INTEGER, lambda v: v >= 0, ">= 0"),
    "max_tokens": (INTEGER, lambda v: v >= 1, ">= 1"),
    "max_new_tokens": (INTEGER, lambda v: 1 <= v <= MOST_NEW_TOKENS, f"in [1, {MOST_NEW_TOKENS}]"),
    "temperature": (NUMBER, lambda v: v > 0, "> 0"),
    "top_k": (INTEGER, lambda v: v >= 0, ">= 0 (0: no top-k filter)"),
    "top_p": (NUMBER, lambda v: 0 < v <= 1, "in (0, 1] (1: no nucleus filter)"),
    "num_samples": (INTEGER, lambda v: 1 <= v <= MOST_SAMPLES, f"in [1, {MOST_SAMPLES}]"),
    "seed": ((numbers.Integral, "an integer or a torch.Generator"), lambda v: -2 ** 63 <= v < 2 ** 64,
             "in [-2**63, 2**64) (what torch's generator takes)"),
}


def out_of_range(values: dict, name=str) -> list[str]:
    """A message for each option in ``values`` (keyword -> value) outside its ``RANGES``, named by ``name(keyword)``."""
    return [f"{name(key)} {value}: must be {RANGES[key][2]}" for key, value in values.items()
            if not RANGES[key][1](value)]


def of_type(value, kind: tuple[type, str]) -> bool:
    """Whether ``value`` is of ``kind`` (INTEGER or NUMBER; numpy's count too). True and False are neither: a
    flag given for a count is a mistake."""
    return isinstance(value, kind[0]) and not isinstance(value, bool)


def check(**values):
    """A TypeError naming every keyword not of its type (2.0 for an integer, "0.8" for a number), else a
    ValueError naming every keyword out of its range."""
    if errors := [f"{key} {value!r}: must be {RANGES[key][0][1]}" for key, value in values.items()
                  if not of_type(value, RANGES[key][0])]:
        raise TypeError("; ".join(errors))
    if errors := out_of_range(values):
        raise ValueError("; ".join(errors))


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


def _warn(messages: list[str], what: str):
    for message in messages:
        warnings.warn(f"{what}: {message}", stacklevel=3)


class Translator:
    """A seq2seq model and its tokenizers. ``max_tokens``: the token budget of a batch of sources."""

    def __init__(self, model, tokenizers, max_tokens: int = 8192):
        check(max_tokens=max_tokens)
        self.model, self.tokenizers, self.max_tokens = model, tokenizers, max_tokens

    def translate(self, sentences: str | list[str], beam_size: int = 1, alpha: float = 0.6,
                  max_extra_tokens: int = 20) -> str | list[str]:
        """The best output for each sentence: greedy search (beam_size 1) or beam search ranked by GNMT's
        length penalty ``alpha``; at most the sentence's length + ``max_extra_tokens`` tokens (eos included).
        A sentence empty or longer than the model's max_len gets "" (with a warning for the long one)."""
        lines, one = texts_of(sentences, "sentences")
        found, messages = self._search(lines, 1, beam_size, alpha, max_extra_tokens)
        _warn(messages, "translate")
        texts = [outputs[0].text if outputs else "" for outputs in found]
        return texts[0] if one else texts

    def n_best(self, sentences: str | list[str], k: int, beam_size: int | None = None, alpha: float = 0.6,
               max_extra_tokens: int = 20) -> list[Output] | list[list[Output]]:
        """Each sentence's ``k`` best outputs, best first, from beam search of ``beam_size`` (default k) beams;
        none for a sentence empty or too long."""
        check(k=k)
        beam_size = k if beam_size is None else beam_size
        check(beam_size=beam_size)
        if k > beam_size:
            raise ValueError(f"k {k}: must be in [1, beam_size {beam_size}] (the beam holds that many outputs)")
        lines, one = texts_of(sentences, "sentences")
        found, messages = self._search(lines, k, beam_size, alpha, max_extra_tokens)
        _warn(messages, "n_best")
        return found[0] if one else found

    def _search(self, lines: list[str], k: int, beam_size: int, alpha: float, max_extra_tokens: int,
                where=by_index) -> tuple[list[list[Output]], list[str]]:
        check(beam_size=beam_size, alpha=alpha, max_extra_tokens=max_extra_tokens)
        _, messages, written = translate_lines(self.model, self.tokenizers, lines, beam_size, alpha, max_extra_tokens,
                                               self.max_tokens, k, where)
        return [outputs_of(self.tokenizers.target, written[i][1]) if i in written else []
                for i in range(len(lines))], messages

    def score(self, sentences: str | list[str], outputs: str | list[str], alpha: float = 0.6
              ) -> Output | None | list[Output | None]:
        """Each output given (a reference translation, say) as the model scores it for its sentence, the way
        beam search would, ending in eos (an empty output is the eos alone); None where the sentence is
        empty, or it or its output is longer than the model's max_len."""
        check(alpha=alpha)
        lines, one = texts_of(sentences, "sentences")
        _, messages, written = score_lines(self.model, self.tokenizers, lines, texts_of(outputs, "outputs")[0], alpha,
                                           self.max_tokens, by_index)
        _warn(messages, "score")
        found = [outputs_of(self.tokenizers.target, written[i][1])[0] if i in written else None
                 for i in range(len(lines))]
        return found[0] if one else found

    def attention(self, sentence: str, output: str | None = None) -> dict[str, Attention]:
        """The attention that writes ``output`` (default: the greedy translation) for ``sentence``, with the
        model teacher-forced on it: "encoder self-attention" over the source tokens, "decoder
        self-attention" and "cross-attention" with a row for each step, labelled by the token it chose."""
        from lib.report.figures import attention_maps, token_strings

        text_of(sentence, "sentence")
        if output is not None:
            text_of(output, "output")
        where = lambda _: "the sentence"  # noqa: E731
        if output is None:  # the search's own tokens, not its text encoded again
            _, messages, written = translate_lines(self.model, self.tokenizers, [sentence], 1, 0.0, 20,
                                                   self.max_tokens, 1, where)
        else:
            _, messages, written = score_lines(self.model, self.tokenizers, [sentence], [output], 0.0,
                                               self.max_tokens, where)
        _warn(messages, "attention")
        if 0 not in written:
            given = "" if output is None else f" -> {output!r}"
            raise ValueError(f"attention: {sentence!r}{given}: nothing the model can read (empty, or longer than "
                             f"its max_len {self.model.cfg.max_len})")
        source, (h,) = written[0]
        ids = special_ids(self.tokenizers)
        batch = collate(Pairs([source], [h.tokens]), [0], ids).to(next(self.model.parameters()).device)
        maps, _ = attention_maps(self.model, batch, ids)
        src, tgt_in = token_strings(self.tokenizers.source, batch.src[0]), token_strings(self.tokenizers.target,
                                                                                          batch.tgt_in[0])
        chose = token_strings(self.tokenizers.target, batch.tgt_out[0])
        labels = {"encoder self-attention": (src, src), "decoder self-attention": (chose, tgt_in),
                  "cross-attention": (chose, src)}
        return {kind: Attention([w[0].float().cpu() for w in maps[kind]], *labels[kind]) for kind in labels}


class LanguageModel:
    """A decoder-only LM and its tokenizer; ``block_size``: the most tokens it reads (its training block)."""

    def __init__(self, model, tokenizers, block_size: int):
        self.model, self.tokenizers, self.block_size = model, tokenizers, block_size

    def _ids(self, text: str, what: str) -> list[int]:
        ids, messages = lm_ids(self.tokenizers, text, what)
        _warn(messages, "lm")
        return ids

    def token_ids(self, ids, what: str) -> list[int]:
        """``ids`` as a list, or a ValueError naming ``what`` where it is empty or holds what is no token id of
        the model's vocabulary; a TypeError where it is no sequence (``as_list``)."""
        ids, vocab_size = as_list(ids, what, "token ids"), self.model.generator.out_features
        if not ids:
            raise ValueError(f"{what}: no tokens")
        if wrong := [i for i in ids if not (of_type(i, INTEGER) and 0 <= i < vocab_size)]:
            raise ValueError(f"{what}: {wrong[0]!r} is not a token id (an integer in [0, {vocab_size}))")
        return ids

    def sampled_ids(self, prompt: list[int], max_new_tokens: int = 200, temperature: float = 0.8, top_k: int = 0,
                    top_p: float = 1.0, seed: int | torch.Generator = 0) -> Iterator[int]:
        """``stream`` on token ids: the new ones, each as it is drawn."""
        prompt = self.token_ids(prompt, "prompt")
        check(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
              **({} if isinstance(seed, torch.Generator) else {"seed": seed}))
        generator = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
        return sampled(self.model, prompt, max_new_tokens, temperature, top_k, generator, self.block_size, top_p)

    def stream(self, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8, top_k: int = 0,
               top_p: float = 1.0, seed: int | torch.Generator = 0) -> Iterator[str]:
        """``sample``'s continuation, as it is drawn: the pieces of text the new tokens add, one at a time
        (``for piece in lm.stream("ROMEO:"): print(piece, end="", flush=True)``)."""
        if not text_of(prompt, "prompt"):
            raise ValueError("prompt: empty; the LM continues a text")
        ids = self._ids(prompt, "the prompt")
        tokens = self.sampled_ids(ids, max_new_tokens, temperature, top_k, top_p, seed)
        return continuation(self.tokenizers.target, list(ids), tokens)  # a copy: it grows, the prompt may not

    def sample(self, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8, top_k: int = 0,
               top_p: float = 1.0, seed: int | torch.Generator = 0) -> str:
        """The prompt and ``max_new_tokens`` more, drawn one at a time with ``temperature``, from the ``top_k``
        likeliest (0: all) and the nucleus of probability ``top_p`` (1: all). ``seed``: an int for a draw
        of its own, or a CPU ``torch.Generator`` to draw from (several samples from one, say)."""
        return prompt + "".join(self.stream(prompt, max_new_tokens, temperature, top_k, top_p, seed))

    def score(self, text: str) -> dict:
        """The LM's tokens, loss (nats a token), perplexity and bits per character on ``text``, as the
        evaluate stage computes them: every token after the first, in consecutive blocks of ``block_size``."""
        return self.score_ids(self._ids(text_of(text, "text"), "the text"), len(text))

    def score_ids(self, ids: list[int], n_chars: int, what: str = "the text") -> dict:
        """``score`` on the token ids of a text of ``n_chars`` characters."""
        if len(ids) < 2:
            raise ValueError(f"{what}: {len(ids)} token(s); scoring needs at least 2 (the first is only read)")
        return text_metrics(self.model, torch.tensor(ids), n_chars, self.block_size)

    def attention(self, text: str | list[int]) -> dict[str, Attention]:
        """The "self-attention" over the first ``block_size`` tokens of ``text`` (or of these token ids): a
        row for each position (predicting the next token) and a column for each position it may read, both
        labelled by the position's token."""
        from lib.report.figures import token_strings

        ids = self.token_ids(self._ids(text, "the text") if isinstance(text, str) else text, "text")
        shown = torch.tensor(ids[:self.block_size])  # (T,)
        with torch.no_grad():
            _, layers = self.model.forward_with_attention(shown[None].to(next(self.model.parameters()).device))
        labels = token_strings(self.tokenizers.target, shown)
        return {"self-attention": Attention([w[0].float().cpu() for w in layers], labels, labels)}


def load(directory: str | Path, device: str | torch.device = "cpu", task: str | None = None
         ) -> Translator | LanguageModel:
    """The model in ``directory`` (model.pt and tokenizer/, as the train and tokenize stages write them): a
    Translator for a seq2seq model, a LanguageModel for an LM, in eval mode on ``device`` ("auto": a GPU
    where there is one); with ``task``, one trained for it. A leading ``~`` in ``directory`` is the home
    directory. ``.state``: what model.pt records beside the weights (its config, step, validation loss)."""
    model, tokenizers, state = checkpoint.load_directory(directory, device_named(device), task=task)
    loaded = _loaded(model, tokenizers, state)
    loaded.state = {key: value for key, value in state.items() if key != "model"}
    return loaded


def _loaded(model, tokenizers, state: dict) -> Translator | LanguageModel:
    if state["kind"] == "lm":
        return LanguageModel(model, tokenizers, state["block_size"])
    return Translator(model, tokenizers)
