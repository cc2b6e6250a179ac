"""The translation tasks' base (multi30k, wmt14): sacreBLEU's BLEU and chrF on detokenised, cased text, and the
paper's tokenised BLEU (wmt14)."""

import re

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

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
TOKENIZED_SIGNATURE = "tok:13a then compounds split at hyphens (##AT##-##AT##), as tensor2tensor's get_ende_bleu.sh"


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU as the paper's figures were computed: over tokens (13a, close to Moses' tokenizer) with compound
    words split at their hyphens, which scores German outputs higher than sacreBLEU does on the same text."""
    tokenize = Tokenizer13a()

    def split(text: str) -> str:
        return COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenize(text))

    bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)  # force: the text is tokenised on purpose
    tokenized = bleu.corpus_score([split(h) for h in hypotheses], [[split(r) for r in references]])
    return {"tokenized_bleu": tokenized.score, "tokenized_bleu_signature": TOKENIZED_SIGNATURE}


class TranslationTask(Task):
    """A translation task: sacreBLEU's BLEU and chrF, BLEU logged after each epoch, BLEU by source length."""

    headline = ("greedy.bleu", "beam*.bleu", "greedy.chrf", "valid_perplexity")
    valid_score = "bleu"
    sentence_score = "sentence_bleu"

    def score(self, hypotheses: list[str], references: list[str]) -> dict:
        return score(hypotheses, references)
