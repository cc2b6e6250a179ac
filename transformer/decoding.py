"""What every search shares (greedy, beam search, sampling: sec. 6.1): hypotheses scored under a length penalty,
and a stepper that feeds the decoder one token at a time.

Every search runs incrementally by default: the decoder keeps each layer's
self-attention keys and values (and the cross-attention ones, computed once
per sentence) in a cache, so a step costs one token's work instead of the
whole prefix's. ``use_cache=False`` re-runs the decoder over the prefix at
every step, as a reference and for the speed benchmark.
Dims: B sentences, S source length, T tokens so far, V vocabulary.
"""

from dataclasses import dataclass

import torch
from torch import nn

from transformer.config import SpecialIds, largest_alpha
from transformer.masks import padding_mask, target_mask


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # without bos and eos
    score: float  # log_prob / length penalty (see ``length_penalty``): what beam search ranks by
    log_prob: float  # the model's log-probability of the tokens, eos included when it ended with one
    eos: bool  # ended with eos (False: cut at its length limit); the eos is part of the score
    token_log_probs: tuple[float, ...] = ()  # each produced token's, eos included; ``score_outputs`` gives them

    @classmethod
    def of(cls, tokens: list[int], log_prob: float, eos: bool, alpha: float,
           token_log_probs: tuple[float, ...] = ()) -> "Hypothesis":
        """An output with its log-probability, scored as beam search ranks it under length penalty ``alpha``."""
        return cls(tokens, log_prob / length_penalty(len(tokens) + eos, alpha), log_prob, eos, token_log_probs)

    def with_alpha(self, alpha: float) -> "Hypothesis":
        """The same output, scored under another length penalty."""
        return Hypothesis.of(self.tokens, self.log_prob, self.eos, alpha, self.token_log_probs)


def length_penalty(length: torch.Tensor | int, alpha: float):
    """GNMT's ((5 + |Y|) / 6) ** alpha (Wu et al., 2016); |Y| counts the produced tokens, eos included."""
    return ((5 + length) / 6) ** alpha


def check_alpha(model, alpha: float, name: str = "alpha"):
    """A ValueError naming ``alpha`` (as ``name``: a flag, a param) where the length penalty of the model's longest
    output (max_len tokens) overflows float32: beam search would rank -inf / inf, a NaN, above every real candidate."""
    longest = model.cfg.max_len
    if not torch.isfinite(length_penalty(torch.tensor(longest), alpha)):
        raise ValueError(f"{name} {alpha}: the length penalty ((5 + length) / 6) ** alpha overflows at this model's "
                         f"longest output ({longest} tokens) for an alpha above {largest_alpha(longest):.1f} "
                         "(GNMT's: 0.6 to 1)")


def check_eval_mode(model):
    """Refuse a model left in training mode with dropout on: every step of a search or score would then be drawn
    from a randomly thinned model, a different output each call and a worse one, and nothing would say so."""
    if model.training and any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        raise ValueError("the model is in training mode, so its dropout would thin it at every step: call "
                         "model.eval() before searching, sampling or scoring (and model.train() to train on)")


class Decoder:
    """One encoded batch, stepped token by token: logits for the next token of every row."""

    def __init__(self, model, src: torch.Tensor, ids: SpecialIds, use_cache: bool, repeat: int = 1,
                 longest: int | None = None):
        """``repeat``: rows per sentence (beams); ``longest``: the most tokens a row will be fed, bos included,
        for the cache to set aside."""
        check_eval_mode(model)
        self.model, self.ids, self.use_cache = model, ids, use_cache
        src_mask = padding_mask(src, ids.pad)  # (B, 1, 1, S)
        memory, _ = model.encode(src, src_mask)  # (B, S, C)
        # Beams: K rows a sentence, sentence-major (row b * K + k); cross attention gives each sentence's memory
        # row to its K rows (transformer.attention).
        self.memory, self.src_mask, self.repeat = memory, src_mask, repeat
        self.cache = model.new_cache(longest) if use_cache else None

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """out (R, T) the tokens so far (bos first) -> next-token logits (R, V)."""
        if self.use_cache:  # only the newest token goes in; the cache holds the rest
            start = out.size(1) - 1
            hidden, _ = self.model.decode(out[:, -1:], self.memory, None, self.src_mask, self.cache, start)
        else:
            hidden, _ = self.model.decode(out, self.memory, target_mask(out, self.ids.pad), self.src_mask)
        return self.model.generator(hidden[:, -1]).float()  # (R, V)

    def select(self, rows: torch.Tensor, sources_too: bool = False):
        """Go on with rows ``rows`` (R,) only, in that order: the hypotheses that survived a step, each
        sentence's K together. With ``sources_too``, sentences left the batch: their encoder output and
        cross-attention keys go as well."""
        sentences = rows[::self.repeat] // self.repeat if sources_too else None  # (R / K,)
        if sentences is not None:
            self.memory, self.src_mask = self.memory[sentences], self.src_mask[sentences]
        if self.cache is not None:
            self.model.select_cache(self.cache, rows, sentences)


def never_pad_or_bos(scores: torch.Tensor, ids: SpecialIds) -> torch.Tensor:
    """scores (R, V), in place: neither pad nor bos can be chosen as a next token. Applied after any
    normalisation, so that the other tokens keep the log-probabilities teacher forcing gives them."""
    scores[:, [ids.pad, ids.bos]] = float("-inf")
    return scores


def limits(model, src: torch.Tensor, max_new_tokens: torch.Tensor) -> torch.Tensor:
    return max_new_tokens.clamp(max=model.cfg.max_len - 1).to(src.device)


def strip(row: list[int], ids: SpecialIds) -> list[int]:
    """Tokens up to the first eos or pad."""
    tokens = []
    for token in row:
        if token in (ids.eos, ids.pad):
            break
        tokens.append(token)
    return tokens
