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
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from lib.use import exported
from lib.data.pairs import Pairs, collate
from transformer.sampling import sampled
from lib.core.distributed import device_named
from lib.evaluate.evaluation import text_metrics
from lib.core.options import OPTIONS, check, or_default, schema_defaults
from lib.evaluate.options import model_defaults
from lib.report.attention_maps import attention_maps, token_strings
from lib.use.lines import (Attention, Output, as_list, by_index, outputs_of, score_lines, text_of, texts_of,
                           translate_lines)
from lib.data.tokenizer import continuation, lm_ids, special_ids

def _warn(messages: list[str], what: str):
    for message in messages:
        warnings.warn(f"{what}: {message}", stacklevel=3)


class Translator:
    """A seq2seq model and its tokenizers. ``defaults``: the options a method left unset takes (by default the
    schema's, lib.core.options; ``load`` gives those the evaluate stage decoded with), ``max_tokens`` among
    them: the token budget of a batch of sources."""

    def __init__(self, model, tokenizers, max_tokens: int | None = None, defaults: dict | None = None):
        self.defaults = schema_defaults() | (defaults or {})
        self.defaults |= {} if max_tokens is None else {"max_tokens": max_tokens}
        check(max_tokens=self.defaults["max_tokens"])
        self.model, self.tokenizers, self.max_tokens = model, tokenizers, self.defaults["max_tokens"]

    def translate(self, sentences: str | list[str], beam_size: int | None = None, alpha: float | None = None,
                  max_extra_tokens: int | None = None) -> str | list[str]:
        """The best output for each sentence: greedy search (beam_size 1) or beam search ranked by GNMT's
        length penalty ``alpha``; at most the sentence's length + ``max_extra_tokens`` tokens (eos included).
        A sentence empty or longer than the model's max_len gets "" (with a warning for the long one). An
        option left out is the model's default (``defaults``)."""
        beam_size, alpha, max_extra_tokens = or_default(self.defaults, beam_size=beam_size, alpha=alpha,
                                                        max_extra_tokens=max_extra_tokens)
        lines, one = texts_of(sentences, "sentences")
        found, messages = self._search(lines, 1, beam_size, alpha, max_extra_tokens)
        _warn(messages, "translate")
        texts = [outputs[0].text if outputs else "" for outputs in found]
        return texts[0] if one else texts

    def n_best(self, sentences: str | list[str], k: int, beam_size: int | None = None, alpha: float | None = None,
               max_extra_tokens: int | None = None) -> list[Output] | list[list[Output]]:
        """Each sentence's ``k`` best outputs, best first, from beam search of ``beam_size`` (default: k or the
        model's default, whichever is wider) beams; none for a sentence empty or too long."""
        check(lambda name: "k", n_best=k)
        beam_size = max(k, self.defaults["beam_size"]) if beam_size is None else beam_size
        alpha, max_extra_tokens = or_default(self.defaults, alpha=alpha, max_extra_tokens=max_extra_tokens)
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

    def score(self, sentences: str | list[str], outputs: str | list[str], alpha: float | None = None
              ) -> Output | None | list[Output | None]:
        """Each output given (a reference translation, say) as the model scores it for its sentence, the way
        beam search would, ending in eos (an empty output is the eos alone); None where the sentence is
        empty, or it or its output is longer than the model's max_len."""
        (alpha,) = or_default(self.defaults, alpha=alpha)
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
        text_of(sentence, "sentence")
        if output is not None:
            text_of(output, "output")
        where = lambda _: "the sentence"  # noqa: E731 - a one-line helper, named where it is used
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
    """A decoder-only LM and its tokenizer; ``block_size``: the most tokens it reads (its training block);
    ``defaults``: the sampling options a method left unset takes (as in ``Translator``)."""

    def __init__(self, model, tokenizers, block_size: int, defaults: dict | None = None):
        self.model, self.tokenizers, self.block_size = model, tokenizers, block_size
        self.defaults = schema_defaults() | (defaults or {})

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
        if wrong := [i for i in ids if not (isinstance(i, numbers.Integral) and not isinstance(i, bool)
                                            and 0 <= i < vocab_size)]:
            raise ValueError(f"{what}: {wrong[0]!r} is not a token id (an integer in [0, {vocab_size}))")
        return ids

    def sampled_ids(self, prompt: list[int], max_new_tokens: int | None = None, temperature: float | None = None,
                    top_k: int | None = None, top_p: float | None = None, seed: int | torch.Generator | None = None
                    ) -> Iterator[int]:
        """``stream`` on token ids: the new ones, each as it is drawn."""
        prompt = self.token_ids(prompt, "prompt")
        max_new_tokens, temperature, top_k, top_p, seed = or_default(
            self.defaults, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        if not isinstance(seed, torch.Generator) and not OPTIONS["seed"].of_type(seed):
            raise TypeError(f"seed {seed!r}: must be an integer or a torch.Generator")
        check(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
              **({} if isinstance(seed, torch.Generator) else {"seed": seed}))
        generator = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
        return sampled(self.model, prompt, max_new_tokens, temperature, top_k, generator, self.block_size, top_p)

    def stream(self, prompt: str, max_new_tokens: int | None = None, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, seed: int | torch.Generator | None = None
               ) -> Iterator[str]:
        """``sample``'s continuation, as it is drawn: the pieces of text the new tokens add, one at a time
        (``for piece in lm.stream("ROMEO:"): print(piece, end="", flush=True)``)."""
        if not text_of(prompt, "prompt"):
            raise ValueError("prompt: empty; the LM continues a text")
        ids = self._ids(prompt, "the prompt")
        tokens = self.sampled_ids(ids, max_new_tokens, temperature, top_k, top_p, seed)
        return continuation(self.tokenizers.target, list(ids), tokens)  # a copy: it grows, the prompt may not

    def sample(self, prompt: str, max_new_tokens: int | None = None, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, seed: int | torch.Generator | None = None) -> str:
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
    model, tokenizers, state = exported.load_directory(directory, device_named(device), task=task)
    loaded = _loaded(model, tokenizers, state, model_defaults(directory))
    loaded.state = {key: value for key, value in state.items() if key != "model"}
    return loaded


def _loaded(model, tokenizers, state: dict, defaults: dict) -> Translator | LanguageModel:
    if state["kind"] == "lm":
        return LanguageModel(model, tokenizers, state["block_size"], defaults)
    return Translator(model, tokenizers, defaults=defaults)
