"""What the translation tasks (multi30k, wmt14) score with: sacreBLEU's BLEU and chrF on detokenised, cased
text, a sentence's BLEU to find the worst, and BLEU by the source's length."""

import pandas as pd
import sacrebleu

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
