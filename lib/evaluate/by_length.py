"""What the evaluate stage writes by length (by_length.csv): a task's score by the source's length in words,
or, for a task with an extra split of every length (cumsum's length study), exact match at each length."""

import pandas as pd

from lib.tasks.base import Task, exact_matches

# Source lengths in words, for BLEU by length: each group holds 75-234 of Multi30k's 1,000 test sentences.
LENGTH_GROUPS = ((1, 7), (8, 9), (10, 11), (12, 13), (14, 16), (17, None))


def length_group(source: str) -> str:
    """The LENGTH_GROUPS label of a source's length in words: "01-07", ..., "17+" (zero-padded: they sort
    shortest first as text)."""
    words = len(source.split())
    for low, high in LENGTH_GROUPS:
        if high is None:
            return f"{low:02d}+"
        if words <= high:
            return f"{low:02d}-{high:02d}"


def score_by_source_length(task: Task, sources: list[str], hypotheses: list[str], references: list[str]
                           ) -> pd.DataFrame:
    """The task's validation score (multi30k's BLEU) of the greedy test outputs by the source's length in words,
    where longer sentences lose: a row per LENGTH_GROUPS group that holds a sentence (group, its shortest length,
    sentences, the score)."""
    name = task.valid_metric or "exact_match"
    groups = pd.DataFrame({"group": [length_group(s) for s in sources], "hyp": hypotheses, "ref": references})
    rows = [{"group": group, "length": int(group[:2]), "sentences": len(rows),
             name: task.score(rows["hyp"].tolist(), rows["ref"].tolist())[name]}
            for group, rows in groups.groupby("group")]
    return pd.DataFrame(rows, columns=["group", "length", "sentences", name])


def share_by_length(sources: list[str], flags: list[bool]) -> dict[int, float]:
    """{1: share of the sequences with 1 digit whose flag is set, ..., 24: ...}, shortest first."""
    frame = pd.DataFrame({"length": [len(s.split()) for s in sources], "flag": flags})
    return {int(length): float(share) for length, share in frame.groupby("length")["flag"].mean().items()}


def lengths_as_numbers(by_length: dict) -> dict[int, float]:
    """A by-length mapping with lengths as numbers, shortest first (the "01" keys of older metrics too)."""
    return dict(sorted((int(length), share) for length, share in by_length.items()))


def exact_match_by_length(sources: list[str], hypotheses: list[str], references: list[str]) -> dict[int, float]:
    """{1: exact match of the sequences with 1 digit, ...} (see share_by_length)"""
    return share_by_length(sources, exact_matches(hypotheses, references))


def extra_split_metrics(study: pd.DataFrame, hypotheses: list[str], test: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    """Length generalisation: exact match at every length of the task's extra split, trained ones and longer ones
    (a table: length, exact_match), and how far up it holds from the shortest trained length, one metric (the
    test split's lengths are the trained ones)."""
    by_length = exact_match_by_length(study["src"].tolist(), hypotheses, study["tgt"].tolist())
    shortest = int(test["src"].str.split().str.len().min())
    table = pd.DataFrame({"length": list(by_length), "exact_match": list(by_length.values())})
    return {"exact_up_to_length": exact_up_to(by_length, shortest)}, table


def exact_up_to(by_length: dict, shortest: int) -> int:
    """The longest length L such that most sequences of every length from ``shortest`` (the shortest trained
    one) up to L come out exact; 0 when not even those of length ``shortest`` do. How far length
    generalisation holds, in one number, for the task's card and a column of `dvc exp show`: trained on 4-12,
    12 means nothing longer came out right. Lengths below ``shortest`` do not count."""
    longest = 0
    for length, share in lengths_as_numbers(by_length).items():
        if length < shortest:
            continue
        if share < 0.5:
            break
        longest = length
    return longest
