"""Batching, collate and the cumsum task's data and scores."""

import itertools

import pandas as pd
import pytest
import torch

from lib.core.config import from_dict
from lib.data.pairs import Pairs, collate, token_budget_batches
from lib.evaluate import by_length
from lib.report.length_study import breaking_length
from lib.tasks import cumsum
from lib.tasks.writing import run_prepare
from lib.data.tokenizer import SpecialIds

IDS = SpecialIds(pad=0, bos=1, eos=2, unk=3)


def random_pairs(n=200):
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 20, (n, 2), generator=g).tolist()
    return Pairs([[5] * a for a, _ in lengths], [[6] * b for _, b in lengths])


def test_token_budget_batches_cover_everything_within_budget():
    pairs = random_pairs()
    batches = token_budget_batches(pairs, 64, torch.Generator().manual_seed(0))
    assert sorted(i for b in batches for i in b) == list(range(len(pairs)))
    for b in batches:
        longest = max(max(len(pairs.src[i]), len(pairs.tgt[i]) + 1) for i in b)
        assert len(b) * longest <= 64
    again = token_budget_batches(pairs, 64, torch.Generator().manual_seed(0))
    assert again == batches  # the seed fixes the order
    assert token_budget_batches(pairs, 64) == token_budget_batches(pairs, 64)


def test_a_real_token_budget_counts_each_side_without_padding():
    """batch_unit real: at most 64 non-pad tokens a side (targets with their eos), so more than padded holds."""
    pairs = random_pairs()
    batches = token_budget_batches(pairs, 64, torch.Generator().manual_seed(0), unit="real")
    assert sorted(i for b in batches for i in b) == list(range(len(pairs)))
    for b in batches:
        assert len(b) == 1 or max(sum(len(pairs.src[i]) for i in b), sum(len(pairs.tgt[i]) + 1 for i in b)) <= 64
    padded = token_budget_batches(pairs, 64, torch.Generator().manual_seed(0))
    assert len(batches) < len(padded)
    rows = torch.tensor([3, 0, 7])
    assert [side.tolist() for side in pairs.side_lengths(rows)] == [[len(pairs.src[i]) for i in rows.tolist()],
                                                                    [len(pairs.tgt[i]) + 1 for i in rows.tolist()]]


def test_collate_shifts_right_and_pads():
    pairs = Pairs([[7, 8, 9], [7]], [[10, 11], [12, 13, 14]])
    batch = collate(pairs, [0, 1], IDS)
    assert batch.src.tolist() == [[7, 8, 9], [7, 0, 0]]
    assert batch.tgt_in.tolist() == [[1, 10, 11, 0], [1, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[10, 11, 2, 0], [12, 13, 14, 2]]
    assert batch.n_tokens == 7


@pytest.mark.parametrize("modulus, last_token", [(0, "72"), (10, "9")])  # 72: 9 * vocab_length
def test_cumsum_splits_are_correct_and_disjoint(tmp_path, tiny_params, modulus, last_token):
    cfg = from_dict(cumsum.PrepareConfig, {**tiny_params["cumsum"]["prepare"], "modulus": modulus},
                    "cumsum.prepare")
    run_prepare("cumsum", cfg, tmp_path / "cumsum")
    splits = {s: pd.read_parquet(tmp_path / "cumsum" / f"{s}.parquet") for s in ("train", "valid", "test")}
    assert [len(splits[s]) for s in splits] == [400, 40, 60]
    study = pd.read_parquet(tmp_path / "cumsum" / "lengths.parquet")
    counts = study["src"].str.split().str.len().value_counts().sort_index()
    assert counts.to_dict() == {1: 5, **{n: 5 for n in range(2, 9)}}  # n_per_length of each length 1..8
    assert not set(study["src"]) & set(splits["train"]["src"])
    for src, tgt in zip(study["src"], study["tgt"]):
        assert list(map(int, tgt.split())) == running_sums(src, modulus)
    for frame in splits.values():
        for src, tgt in zip(frame["src"], frame["tgt"]):
            digits = list(map(int, src.split()))
            assert 2 <= len(digits) <= 5
            assert list(map(int, tgt.split())) == running_sums(src, modulus)
    train, valid, test = (set(splits[s]["src"]) for s in splits)
    assert not train & valid and not train & test and not valid & test
    assert (tmp_path / "cumsum" / "alphabet.txt").read_text().split()[-1] == last_token
    if modulus:
        assert {t for tgt in splits["train"]["tgt"] for t in tgt.split()} == set("0123456789")


def running_sums(src: str, modulus: int) -> list[int]:
    """The expected targets, written out apart from lib's running_sums."""
    sums = list(itertools.accumulate(map(int, src.split())))
    return [s % modulus for s in sums] if modulus else sums


def test_cumsum_score():
    scores = cumsum.Cumsum().score(["1 3 6", "2 5", "4"], ["1 3 6", "2 4", "4 9"])
    assert scores["exact_match"] == 1 / 3
    assert scores["token_accuracy"] == 5 / 7


def test_exact_match_by_length_is_by_digits_shortest_first():
    sources = [" ".join("1" * n) for n in (12, 1, 2, 2, 10)]
    references = [" ".join(str(k + 1) for k in range(n)) for n in (12, 1, 2, 2, 10)]
    hypotheses = list(references)
    hypotheses[2] = "1"  # one of the two length-2 sequences stops early
    shares = by_length.exact_match_by_length(sources, hypotheses, references)
    assert shares == {1: 1.0, 2: 0.5, 10: 1.0, 12: 1.0} and list(shares) == [1, 2, 10, 12]


def test_breaking_length_is_where_most_fail_else_the_first_error():
    assert breaking_length({"01": 1.0, "02": 0.98, "03": 0.6, "04": 0.4, "05": 0.0}) == 4
    assert breaking_length({"01": 0.0, "02": 1.0, "10": 0.1}) == 1  # short sources can be the ones
    assert breaking_length({"1": 1.0, "2": 0.98, "10": 0.99, "11": 0.5}) == 2  # none below half
    assert breaking_length({"01": 1.0, "12": 1.0}) is None


def test_exact_up_to_is_the_last_length_before_most_fail_from_the_shortest_trained():
    assert by_length.exact_up_to({"01": 1.0, "02": 0.98, "03": 0.6, "04": 0.4, "05": 0.9}, 1) == 3  # not again at 5
    assert by_length.exact_up_to({"1": 1.0, "2": 0.5, "10": 0.99, "11": 0.49}, 1) == 10  # in number order; half holds
    assert by_length.exact_up_to({"01": 0.0, "02": 1.0, "03": 1.0, "04": 0.1}, 2) == 3  # shorter than trained: no say
    assert by_length.exact_up_to({"01": 1.0, "02": 0.2, "03": 1.0}, 2) == 0  # the shortest trained fails
    assert by_length.exact_up_to({"01": 1.0, "24": 1.0}, 1) == 24
