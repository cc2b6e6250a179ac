"""The translation tasks' base (multi30k, wmt14): sacreBLEU's BLEU and chrF on detokenised, cased text, and the
paper's tokenised BLEU (wmt14)."""

import functools
import re

import sacrebleu
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from lib.tasks.base import Task


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU (13a tokenisation, cased) and chrF, with the signatures that say how."""
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {"bleu": bleu_score.score, "chrf": chrf_score.score,
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


COMPOUND = re.compile(r"(\S)-(\S)")  # a hyphen inside a word: "Ost-West" -> "Ost ##AT##-##AT## West"
TOKENIZED_SIGNATURE = ("tensor2tensor's get_ende_bleu.sh: Moses replace-unicode-punctuation and tokenizer -l de "
                       "(sacremoses), compounds split (##AT##-##AT##), multi-bleu.perl's BLEU")


@functools.cache
def moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
    return MosesPunctNormalizer(lang), MosesTokenizer(lang)


def paper_tokens(text: str, lang: str = "de") -> str:
    """A sentence as the paper's BLEU script reads it: Moses' replace-unicode-punctuation.perl, tokenizer.perl
    (its escaping of & < > " ' [ ] | included) and the compounds split at their hyphens, as perl -ple does."""
    normalizer, tokenizer = moses(lang)
    tokens = tokenizer.tokenize(normalizer.replace_unicode_punct(text), return_str=True, escape=True)
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokens)


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU as the paper's figures were computed (tensor2tensor's get_ende_bleu.sh): over Moses' German tokens,
    compound words split, scored as multi-bleu.perl does (one reference, no smoothing), which scores German
    outputs higher than sacreBLEU does on the same text."""
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)  # tokenised on purpose
    tokenized = bleu.corpus_score([paper_tokens(h) for h in hypotheses], [[paper_tokens(r) for r in references]])
    return {"tokenized_bleu": tokenized.score, "tokenized_bleu_signature": TOKENIZED_SIGNATURE}


class TranslationTask(Task):
    """A translation task: sacreBLEU's BLEU and chrF, BLEU logged after each epoch, BLEU by source length."""

    scores = ("bleu", "chrf")
    headline = ("greedy.bleu", "beam*.bleu", "greedy.chrf", "valid_perplexity")
    valid_metric = "bleu"

    def score(self, hypotheses: list[str], references: list[str]) -> dict:
        return score(hypotheses, references)

    def sentence_score(self, hypothesis: str, reference: str) -> float:
        """Sentence BLEU (smoothed), for finding the worst translations."""
        return sacrebleu.sentence_bleu(hypothesis, [reference]).score
