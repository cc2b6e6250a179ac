"""Token ids written once and memory-mapped (lib.data.token_store): the same pairs, batches and collate as the
in-memory lists, and a damaged file named."""

import json
import random

import pytest
import torch

from lib.data.pairs import Pairs, collate, token_budget_batches
from lib.data.token_store import MappedPairs, side_paths, write_pairs
from lib.data.tokenizer import SpecialIds


def random_pairs(n: int, seed: int = 0) -> Pairs:
    """Pairs of random ids and lengths, an empty target among them, ids past 65,535 too (a 37k vocabulary
    and more fit)."""
    rng = random.Random(seed)
    src = [[rng.randrange(4, 70_000) for _ in range(rng.randrange(1, 30))] for _ in range(n)]
    tgt = [[rng.randrange(4, 70_000) for _ in range(rng.randrange(0, 30))] for _ in range(n)]
    return Pairs(src, tgt)


def chunks(pairs: Pairs, size: int):
    for first in range(0, len(pairs), size):
        yield Pairs(pairs.src[first:first + size], pairs.tgt[first:first + size])


IDS = SpecialIds(pad=0, bos=1, eos=2, unk=3)


def test_written_and_mapped_pairs_batch_as_the_lists_do(tmp_path):
    pairs = random_pairs(500)
    counts = write_pairs(chunks(pairs, 64), tmp_path, "train")
    assert counts == json.loads((tmp_path / "train.tokens.json").read_text())
    mapped = MappedPairs(tmp_path, "train")
    assert len(mapped) == 500 and mapped.widths() == pairs.widths()
    assert [mapped.src[i] for i in range(500)] == pairs.src and list(mapped.tgt) == pairs.tgt
    batches = token_budget_batches(pairs, 256, torch.Generator().manual_seed(0))
    assert token_budget_batches(mapped, 256, torch.Generator().manual_seed(0)) == batches
    assert token_budget_batches(mapped, 256, unit="real") == token_budget_batches(pairs, 256, unit="real")
    assert all(torch.equal(a, b) for a, b in zip(mapped.side_lengths(), pairs.side_lengths()))
    for indices in batches:
        a, b = collate(pairs, indices, IDS), collate(mapped, indices, IDS)
        for name in ("src", "tgt_in", "tgt_out"):
            assert getattr(b, name).dtype == torch.long and torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.n_tokens == b.n_tokens


def test_a_split_of_no_pairs_maps_too(tmp_path):
    write_pairs([], tmp_path, "valid")
    assert len(MappedPairs(tmp_path, "valid")) == 0


@pytest.mark.parametrize("damage, said", [
    ("truncate", r"train\.src\.ids: [\d,]+ bytes where its counts say [\d,]+ \(truncated, or from another run\); "
                 r"re-run the tokenize stage"),
    ("meta", r"train\.tokens\.json: not the counts of a split .*; re-run the tokenize stage"),
    ("lengths", r"train\.tgt\.lengths: its lengths do not add up to the ids written; re-run the tokenize stage"),
    ("missing", r"train\.tokens\.json: not found \(run the tokenize stage first\)"),
])
def test_a_damaged_file_is_named_with_the_stage_to_run(tmp_path, damage, said):
    write_pairs(chunks(random_pairs(100), 30), tmp_path, "train")
    ids, lengths = side_paths(tmp_path, "train", "src")[0], side_paths(tmp_path, "train", "tgt")[1]
    if damage == "truncate":
        ids.write_bytes(ids.read_bytes()[:-3])
    elif damage == "meta":
        (tmp_path / "train.tokens.json").write_text("{")
    elif damage == "lengths":
        raw = bytearray(lengths.read_bytes())
        raw[0] ^= 1
        lengths.write_bytes(bytes(raw))
    else:
        (tmp_path / "train.tokens.json").unlink()
    with pytest.raises((ValueError, FileNotFoundError), match=said):
        MappedPairs(tmp_path, "train")
