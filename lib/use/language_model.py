"""The Python API over a decoder-only LM (lib.use.inference loads one): sample, stream, score, attention."""

import numbers
from collections.abc import Iterator

import torch

from transformer.sampling import sampled
from lib.evaluate.evaluation import text_metrics
from lib.core.options import OPTIONS
from lib.evaluate.options import check, or_default, schema_defaults
from lib.report.attention_maps import token_strings
from lib.use.lines import Attention, as_list, text_of, warn_each
from lib.data.tokenizer import continuation, lm_ids


class LanguageModel:
    """A decoder-only LM and its tokenizer; ``block_size``: the most tokens it reads (its training block);
    ``defaults``: the sampling options a method left unset takes (as in ``Translator``)."""

    def __init__(self, model, tokenizers, block_size: int, defaults: dict | None = None):
        self.model, self.tokenizers, self.block_size = model, tokenizers, block_size
        self.defaults = schema_defaults() | (defaults or {})

    def _ids(self, text: str, what: str) -> list[int]:
        ids, messages = lm_ids(self.tokenizers, text, what)
        warn_each(messages, "lm")
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
