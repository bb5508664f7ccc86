"""The benchmark harness's interleaving: every contender takes every place in the round order
equally often, so none always runs right after eager PyTorch (whose idle oneDNN threads and
cache contents cost the next call 10-15 % on the 2-core VM)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.harness import faults_per_call, interleaved_samples, round_order, settle


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
    timed = calls[9:]  # after three warm-up calls each (settle's two, the sizing one)
    assert timed == [name for r in range(6) for name in round_order(list("ABC"), r)]


def test_page_faults_are_counted_per_call() -> None:
    """A call that writes every page of a fresh 4 MiB anonymous mapping faults each page in (1024
    pages of 4 KiB, or fewer huge pages where the kernel gives them); one that rewrites a mapping
    it keeps takes none."""
    import mmap

    size = 4 << 20
    kept = mmap.mmap(-1, size)

    def touch(m: mmap.mmap) -> None:
        for off in range(0, size, 4096):
            m[off] = 1

    def fresh() -> None:
        m = mmap.mmap(-1, size)
        touch(m)
        m.close()

    assert faults_per_call(fresh, calls=5) >= 2
    assert faults_per_call(lambda: touch(kept), calls=5) < 2


def test_settle_warms_until_no_route_is_measuring() -> None:
    """A function whose first 5 calls run partitions still being measured is called a 6th time."""
    from torchburn import routing

    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        if len(calls) <= 5:
            routing._count_measured_call()

    assert settle(fn) == 6 and len(calls) == 6
    assert settle(lambda: None) == 2


def test_settle_reaches_a_compiled_functions_pinned_routes() -> None:
    """After settle, a torchburn-compiled function's calls measure nothing more: its partitions
    are pinned (routing on, as users run it; the test sessions switch it off by default)."""
    import torch

    from torchburn import routing

    fn = torch.compile(
        lambda x: torch.nn.functional.gelu(x @ x) * 2,
        backend="torchburn",
        options={"warn": False, "cache": False, "routing": "measure"},
    )
    x = torch.randn(64, 64)
    n = settle(lambda: fn(x))
    assert n > 2  # it measured first
    before = routing.measured_calls()
    fn(x)
    assert routing.measured_calls() == before
