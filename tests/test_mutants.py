"""benchmarks/mutants.py stays runnable: a whole run takes over an hour, so a mutation whose line has since
changed would otherwise be found stale only then, and the mistake it plants go untried."""

from benchmarks.mutants import MUTATIONS, mutated
from tests.conftest import ROOT


def test_every_mutation_replaces_one_piece_of_todays_code():
    stale = {what: path for what, path, old, new, _ in MUTATIONS
             if mutated((ROOT / path).read_text(encoding="utf-8"), old, new) is None}
    assert stale == {}, "update these mutations to the code as it is now"
    assert len({what for what, *_ in MUTATIONS}) == len(MUTATIONS)  # --only picks them by description
