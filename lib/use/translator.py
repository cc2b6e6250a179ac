"""The Python API over a seq2seq model (lib.use.inference loads one): translate, n-best, score, attention."""

from lib.data.pairs import Pairs, collate
from lib.evaluate.options import check, or_default, schema_defaults
from lib.report.attention_maps import attention_maps, token_strings
from lib.use.lines import (Attention, Output, by_index, outputs_of, score_lines, text_of, texts_of,
                           translate_lines, warn_each)
from lib.data.tokenizer import special_ids


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
        warn_each(messages, "translate")
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
        warn_each(messages, "n_best")
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
        warn_each(messages, "score")
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
        warn_each(messages, "attention")
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
