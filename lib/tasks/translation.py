"""What the translation tasks (multi30k, wmt14) score with: sacreBLEU's BLEU and chrF on detokenised, cased
text, the paper's tokenised BLEU (wmt14), a sentence's BLEU to find the worst, and BLEU by the source's length."""

import re

import pandas as pd
import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

# Source lengths in words, for BLEU by length: each group holds 75-234 of Multi30k's 1,000 test sentences.
LENGTH_GROUPS = ((1, 7), (8, 9), (10, 11), (12, 13), (14, 16), (17, None))


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


def length_group(source: str) -> str:
    """The LENGTH_GROUPS label of a source's length in words: "01-07", ..., "17+" (zero-padded: they sort
    shortest first as text)."""
    words = len(source.split())
    for low, high in LENGTH_GROUPS:
        if high is None:
            return f"{low:02d}+"
        if words <= high:
            return f"{low:02d}-{high:02d}"


def breakdown(sources: list[str], hypotheses: list[str], references: list[str]) -> pd.DataFrame:
    """Corpus BLEU of the (greedy) test translations by the source's length in words, where longer sentences
    lose: a row per LENGTH_GROUPS group that holds a sentence (group, its shortest length, sentences, bleu)."""
    groups = pd.DataFrame({"group": [length_group(s) for s in sources], "hyp": hypotheses, "ref": references})
    rows = [{"group": group, "length": int(group[:2]), "sentences": len(rows),
             "bleu": score(rows["hyp"].tolist(), rows["ref"].tolist())["bleu"]}
            for group, rows in groups.groupby("group")]
    return pd.DataFrame(rows, columns=["group", "length", "sentences", "bleu"])


def sentence_score(hypothesis: str, reference: str) -> float:
    """Per-sentence BLEU (smoothed), for finding the worst translations."""
    return sacrebleu.sentence_bleu(hypothesis, [reference]).score
