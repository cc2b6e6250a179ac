"""What the report reads from a task's length study (cumsum's): where exact match breaks, and the accuracy by
target value for a task whose targets are numbers."""

import pandas as pd

from lib.evaluate.by_length import lengths_as_numbers


def breaking_length(by_length: dict) -> int | None:
    """The shortest length at which most sequences come out wrong; failing that, the shortest with any
    wrong; None when every sequence of every length is exact. The report shows attention there."""
    shares = lengths_as_numbers(by_length)
    for limit in (0.5, 1.0):
        failing = [length for length, share in shares.items() if share < limit]
        if failing:
            return failing[0]
    return None


def accuracy_by_value(samples: pd.DataFrame, train: pd.DataFrame) -> pd.DataFrame:
    """Greedy token accuracy on the test split by the target value (a running sum), with how often that value
    is a target token in training: the rare large sums are where the model guesses a common one."""
    test = samples[samples["split"] == "test"]
    rows = [(value, hypothesis[t] == value if t < len(hypothesis) else False)
            for reference, greedy in zip(test["reference"], test["greedy"].fillna(""))
            for hypothesis in [greedy.split()] for t, value in enumerate(reference.split())]
    table = pd.DataFrame(rows, columns=["value", "correct"]).astype({"value": int})
    table = table.groupby("value")["correct"].agg(tokens="size", accuracy="mean").reset_index()
    seen = train["tgt"].str.split().explode().astype(int).value_counts()
    return table.assign(train_count=table["value"].map(seen).fillna(0).astype(int))
