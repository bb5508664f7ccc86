"""Routing by measurement on the installed engines and real models: whichever path each partition
ends up on, every call (while measuring and after) computes what eager computes, each partition
either decides or says why it is not measured, and the op counts add up.

No assertion on which path wins: that is the machine's business (the structural cases are in
packages/tb-core/tests/test_routing.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import ENGINES

import torchburn
from torchburn import routing
from torchburn.low_precision_route import MAX_DECISION_CALLS, SETTLE_CALLS
from torchburn.testing.models import MODELS


def _reports(model: torch.nn.Module, engine: str) -> tuple[Any, list[Any]]:
    sink: list[Any] = []
    options = {"engine": engine, "routing": "measure", "warn": False, "report_sink": sink}
    return torch.compile(model, backend="torchburn", options=options), sink


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["readme_mlp", "small_cnn", "transformer_layer"])
def test_every_call_matches_eager_and_each_partition_decides(engine: str, name: str) -> None:
    # a static compile: an earlier test that compiled the same forward at other sizes would have
    # made Dynamo mark them dynamic here (its automatic dynamic shapes), and a partition
    # specialised per shape reports its routes apart from the ones counted below
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, args = MODELS[name]()
    model.eval()
    with torch.no_grad():
        expected = model(*args)
        compiled, sink = _reports(model, engine)
        # until every route decided: the partitions' (a window, or two for a close decision for
        # eager), then the whole graph's compiled-or-as-traced one (its settling and blocks)
        bound = routing.MAX_DECISION_CALLS + SETTLE_CALLS + MAX_DECISION_CALLS + 3
        for i in range(bound):
            torch.testing.assert_close(compiled(*args), expected, rtol=1e-4, atol=1e-4)
            if i >= 2 and not any(g.pending_routes() for g in sink):
                break
        assert not any(g.pending_routes() for g in sink), f"still measuring after {bound} calls"
    threads = torch.get_num_threads()
    parts = [p for g in sink for p in g.partitions if p.status in ("compiled", "cache hit")]
    assert parts, f"{engine} took nothing of {name}"
    for p in parts:
        assert p.route is not None
        if p.route.measured and not p.route.reason:
            decision = p.route.decisions[threads]
            assert decision.choice in ("engine", "eager") and decision.engine_s > 0 and decision.eager_s > 0
        else:
            assert p.route.reason
    torchburn.reset_stats()
    with torch.no_grad():
        compiled(*args)
    cov = torchburn.op_coverage()
    routed = sum(cov["routed"].values())
    on_engine = sum(cov["native"].values()) + sum(cov["delegated"].values())

    def eager_now(p: Any) -> bool:
        """The partition's calls at this thread count run eager (``p.routed`` means eager at every
        thread count decided so far: a decision at another count must not change this count)."""
        if p.shapes is not None or p.route is None:
            return bool(p.routed)
        d = p.route.decisions.get(threads)
        return d is not None and d.choice == "eager"

    # a graph whose whole-graph route (compiled or as Dynamo traced it, by measurement: the
    # measurement may outlast the partitions') chose the graph as traced runs eager PyTorch alone
    traced = [g for g in sink if g.traced_only]
    if traced:
        assert routed == sum(len(g.low_precision.ops) for g in traced)
        parts = [p for g in sink if not g.traced_only for p in g.partitions if p.status in ("compiled", "cache hit")]
        routed -= sum(len(g.low_precision.ops) for g in traced)
    expected_routed = sum(len([op for op in p.ops if op != "getitem"]) for p in parts if eager_now(p))
    assert routed == expected_routed, [(p.status, p.route.describe() if p.route else None) for p in parts]
    assert on_engine + routed == sum(len([op for op in p.ops if op != "getitem"]) for p in parts)


@pytest.mark.parametrize("engine", ENGINES)
def test_training_step_routes_forward_and_backward_alike(engine: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    reference.load_state_dict(model.state_dict())
    x = torch.randn(16, 32)
    compiled, sink = _reports(model, engine)
    for _ in range(routing.MAX_CALLS + 2):
        model.zero_grad()
        reference.zero_grad()
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    assert {g.kind for g in sink} >= {"forward", "backward"}
