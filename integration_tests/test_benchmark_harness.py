"""The benchmark harness's interleaving: every contender takes every place in the round order
equally often, so none always runs right after eager PyTorch (whose idle oneDNN threads and
cache contents cost the next call 10-15 % on the 2-core VM)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.harness import interleaved_samples, round_order


def test_two_contenders_alternate_abba() -> None:
    assert [tuple(round_order(["A", "B"], r)) for r in range(4)] == [("A", "B"), ("B", "A"), ("B", "A"), ("A", "B")]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_place_and_predecessor_balanced(n: int) -> None:
    names = [chr(ord("A") + i) for i in range(n)]
    rounds = [round_order(names, r) for r in range(2 * n)]
    assert all(sorted(order) == names for order in rounds)
    places = Counter((name, order.index(name)) for order in rounds for name in order)
    assert set(places.values()) == {2}  # each contender twice in each place
    first = Counter(order[0] for order in rounds)
    assert set(first.values()) == {2}


def test_samples_follow_the_round_order() -> None:
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "ABC"}
    samples = interleaved_samples(fns, repeats=6, min_time=0.0)
    assert {k: len(v) for k, v in samples.items()} == {"A": 6, "B": 6, "C": 6}
    timed = calls[6:]  # after two warm-up calls each
    assert timed == [name for r in range(6) for name in round_order(list("ABC"), r)]
