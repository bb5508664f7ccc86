"""torchburn.low_precision_route: a bfloat16 / float16 inference graph runs widened (on the engines)
or as traced (eager PyTorch, in its own dtype), whichever measured faster.

Slowness is structural, never a real kernel's speed: the "laggard" engine's programs sleep
SLEEP seconds a call, and so does the ``tblowp::slow_scale`` op's PyTorch kernel. A sleep of 3 ms
against microseconds of work cannot lose to noise.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

import torchburn
from torchburn import low_precision_route, routing
from torchburn.low_precision_route import MEASURE_CALLS, SETTLE_CALLS, LowPrecisionRoute, not_measured_reason
from torchburn.options import Options
from torchburn.partition import GraphReport
from torchburn.testing.models import readme_mlp

SLEEP = 0.003
BF16 = torch.bfloat16


@torch.library.custom_op("tblowp::slow_scale", mutates_args=())
def slow_scale(x: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch's kernel for this op is slow on purpose."""
    time.sleep(SLEEP)
    return x * 2


@slow_scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Laggard(torchburn.Engine):
    """A float32-only Python engine whose programs sleep ``sleep`` seconds per call."""

    name = "laggard"
    priority = 5
    sleep: ClassVar[float] = SLEEP
    calls: ClassVar[int] = 0

    def runs_registered_kernels(self) -> bool:
        return True

    def compile(self, plan: torchburn.Plan) -> Any:
        program = super().compile(plan)

        def run(*args: Any) -> Any:
            Laggard.calls += 1
            if Laggard.sleep:
                time.sleep(Laggard.sleep)
            return program(*args)

        return run


_KERNELS: dict[str, Callable[..., Any]] = {
    "aten.addmm.default": torch.ops.aten.addmm.default,
    "aten.relu.default": torch.ops.aten.relu.default,
    "aten.permute.default": torch.ops.aten.permute.default,
    "aten._to_copy.default": torch.ops.aten._to_copy.default,
    "aten.mul.Tensor": torch.ops.aten.mul.Tensor,
    "aten.add.Tensor": torch.ops.aten.add.Tensor,
}


class LaggardPlugin:
    @torchburn.hookimpl
    def tb_register_engines(self) -> list[Any]:
        return [Laggard]

    @torchburn.hookimpl
    def tb_register_kernels(self, registry: torchburn.KernelRegistry) -> None:
        for op, fn in _KERNELS.items():
            # float32 compute; the casts (``_to_copy``) read and write any floating dtype
            dtypes = (torch.float32, BF16, torch.float16) if op == "aten._to_copy.default" else (torch.float32,)
            registry.register("laggard", op, fn, torchburn.accepts(dtypes))


@pytest.fixture
def laggard(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Laggard]]:
    """The laggard engine, its partitions kept on it (partition routing would send its sleeping
    programs to eager and leave two near-equal paths for the graph-level choice to flip between)."""
    monkeypatch.setattr(routing, "not_measured_reason", lambda *args: "test: partitions stay on their engine")
    torchburn.register_plugin(LaggardPlugin(), "laggard-plugin")
    Laggard.sleep, Laggard.calls = SLEEP, 0
    # one thread: with a neighbouring test worker on the other core, an OpenMP region of eager's
    # kernels waits a scheduler tick for its descheduled partner (~15 ms), which would drown the
    # structural 3 ms
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Laggard
    finally:
        torch.set_num_threads(threads)


def compile_model(
    model: Any, dynamic: bool | None = None, **options: Any
) -> tuple[Callable[..., Any], list[GraphReport]]:
    sink: list[GraphReport] = []
    opts = {"engine": "laggard", "routing": "measure", "warn": False, "cache": False, "report_sink": sink, **options}
    return torch.compile(model, backend="torchburn", options=opts, dynamic=dynamic), sink


def bf16_mlp(batch: int = 4) -> tuple[torch.nn.Module, torch.Tensor]:
    model, (x,) = readme_mlp(batch=batch)
    return model.to(BF16).eval(), x.to(BF16)


def calls_to_decide() -> int:
    return SETTLE_CALLS + MEASURE_CALLS + 2


# -- through torch.compile ---------------------------------------------------------------------


def test_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHBURN_LOW_PRECISION", raising=False)
    assert Options().widen_low_precision()
    monkeypatch.setenv("TORCHBURN_LOW_PRECISION", "0")
    assert not Options().widen_low_precision()


def test_slow_widened_graph_runs_as_traced(laggard: type[Laggard]) -> None:
    model, x = bf16_mlp()
    compiled, sink = compile_model(model)
    with torch.no_grad():
        expected = model(x)
        for _ in range(calls_to_decide()):
            out = compiled(x)
            assert out.dtype == BF16
            torch.testing.assert_close(out, expected, rtol=1.6e-2, atol=1e-2)
        (report,) = sink
        stats = report.low_precision
        assert stats is not None and not stats.pending
        assert stats.traced_only and report.traced_only
        decision = stats.decisions[torch.get_num_threads()]
        assert decision.choice == routing.EAGER and decision.engine_s > SLEEP
        # as traced, the graph is eager PyTorch's bit for bit
        torchburn.reset_stats()
        before = Laggard.calls
        assert torch.equal(compiled(x), expected)
        assert Laggard.calls == before
    cov = torchburn.op_coverage()
    assert cov["native"] == {} and cov["fallback"] == {}
    assert cov["routed"] == {"aten.addmm.default": 2, "aten.relu.default": 1, "aten.permute.default": 2}
    assert report.native_ops() == Counter() and report.routed_ops() == Counter(cov["routed"])
    assert "as traced (eager PyTorch)" in stats.describe()


def test_explain_says_which_path(laggard: type[Laggard]) -> None:
    model, x = bf16_mlp()
    with torch.no_grad():
        text = str(torchburn.explain(model, x, options={"engine": "laggard", "routing": "measure", "cache": False}))
    assert "bfloat16/float16 graph, widened or as traced by measurement:" in text
    assert "as traced (eager PyTorch)" in text


@pytest.mark.parametrize("options", [{"routing": "off"}, {"low_precision": False}])
def test_not_measured_when_routing_is_off_or_the_pass_is(laggard: type[Laggard], options: dict[str, Any]) -> None:
    model, x = bf16_mlp()
    compiled, sink = compile_model(model, **options)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1.6e-2, atol=1e-2)
    assert sink[0].low_precision is None


def test_float32_graph_runs_as_dynamo_traced_it_when_that_is_faster(laggard: type[Laggard]) -> None:
    """Direct inference of a float32 graph: the compiled graph against Dynamo's own graph in
    eager PyTorch (the floor: no graph slower than eager), the same measurement, nothing widened."""
    model, (x,) = readme_mlp(batch=2)
    model = model.eval()
    compiled, sink = compile_model(model)
    with torch.no_grad():
        expected = model(x)
        for _ in range(calls_to_decide()):
            torch.testing.assert_close(compiled(x), expected)
        (report,) = sink
        stats = report.low_precision
        assert stats is not None and not stats.widened and not stats.pending
        decision = stats.decisions[torch.get_num_threads()]
        assert decision.choice == routing.EAGER and decision.engine_s > SLEEP
        torchburn.reset_stats()
        before = Laggard.calls
        assert torch.equal(compiled(x), expected)  # Dynamo's graph: eager PyTorch's kernels
        assert Laggard.calls == before
    cov = torchburn.op_coverage()
    assert cov["native"] == {} and cov["fallback"] == {}
    assert cov["routed"] == {"aten.addmm.default": 2, "aten.relu.default": 1, "aten.permute.default": 2}
    assert "compiled" in stats.describe() and "widened" not in stats.describe()
    with torch.no_grad():
        text = str(torchburn.explain(model, x, options={"engine": "laggard", "routing": "measure", "cache": False}))
    assert "whole graph, compiled or as Dynamo traced it (eager PyTorch) by measurement:" in text


def test_float32_graph_through_aot_is_not_wrapped(laggard: type[Laggard]) -> None:
    model, (x,) = readme_mlp(batch=2)
    compiled, sink = compile_model(model.eval(), direct_inference=False)
    with torch.no_grad():
        compiled(x)
    assert sink[0].low_precision is None


def test_training_graphs_are_not_compared(laggard: type[Laggard]) -> None:
    model, x = bf16_mlp()
    compiled, sink = compile_model(model)
    compiled(x).float().sum().backward()
    assert sink and all(g.low_precision is None for g in sink)
    assert model.fc1.weight.grad is not None and model.fc1.weight.grad.dtype == BF16


def test_autocast_graph(laggard: type[Laggard]) -> None:
    model, (x,) = readme_mlp(batch=3)
    model = model.eval()
    compiled, sink = compile_model(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        expected = model(x)
        for _ in range(calls_to_decide()):
            torch.testing.assert_close(compiled(x), expected, rtol=1.6e-2, atol=1e-2)
    assert sink[-1].low_precision is not None and sink[-1].traced_only


# -- the route itself ----------------------------------------------------------------------------


def _traced(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def test_waits_for_the_partitions_then_measures() -> None:
    x = torch.randn(4, 4).to(BF16)
    traced = _traced(lambda t: torch.relu(t) + 1, x)
    wide_calls = []

    def wide(t: torch.Tensor) -> torch.Tensor:
        wide_calls.append(1)
        time.sleep(SLEEP)
        return torch.relu(t) + 1

    pending = {"left": 5}

    def partitions_pending() -> bool:
        pending["left"] -= 1
        return pending["left"] >= 0

    route = LowPrecisionRoute(wide, traced, pending=partitions_pending, engine="laggard", fallback_ops=Counter())
    for _ in range(5):
        route(x)
    assert len(wide_calls) == 5 and route.stats.measuring == {}  # settling: the widened graph alone
    for _ in range(MEASURE_CALLS + 1):
        torch.testing.assert_close(route(x), torch.relu(x) + 1)
    assert route.stats.traced_only


def test_settling_is_bounded() -> None:
    x = torch.randn(4, 4).to(BF16)
    traced = _traced(lambda t: t * 2, x)

    def wide(t: torch.Tensor) -> torch.Tensor:
        time.sleep(SLEEP)
        return t * 2

    route = LowPrecisionRoute(wide, traced, pending=lambda: True, engine="e", fallback_ops=Counter())
    for _ in range(calls_to_decide()):
        route(x)
    assert route.stats.traced_only  # measured although the partitions never stopped measuring


def test_each_thread_count_settles_before_it_is_measured() -> None:
    """Partitions route per thread count: after one count settled and was decided, a new count
    runs the widened graph alone again while its partitions measure, before the comparison."""
    x = torch.randn(4, 4).to(BF16)
    traced = _traced(lambda t: t * 2, x)
    wide_calls: list[int] = []
    pending = {"calls": 3}

    def wide(t: torch.Tensor) -> torch.Tensor:
        wide_calls.append(torch.get_num_threads())
        return t * 2

    def partitions_pending() -> bool:
        pending["calls"] -= 1
        return pending["calls"] >= 0

    route = LowPrecisionRoute(wide, traced, pending=partitions_pending, engine="e", fallback_ops=Counter())
    before = torch.get_num_threads()
    other = 2 if before != 2 else 1
    try:
        for _ in range(3 + MEASURE_CALLS):
            route(x)
        assert set(route.stats.decisions) == {before}
        torch.set_num_threads(other)
        pending["calls"] = 3
        wide_calls.clear()
        for _ in range(3):
            route(x)
        # settling at the new count: the widened graph alone, nothing measured yet
        assert wide_calls == [other] * 3 and route.stats.measuring == {}
        for _ in range(MEASURE_CALLS):
            route(x)
        assert set(route.stats.decisions) == {before, other}
    finally:
        torch.set_num_threads(before)


def test_slow_traced_graph_keeps_the_widened_one() -> None:
    x = torch.randn(4, 4).to(BF16)
    traced = _traced(lambda t: slow_scale(t), x)
    route = LowPrecisionRoute(lambda t: t * 2, traced, pending=lambda: False, engine="e", fallback_ops=Counter())
    for _ in range(MEASURE_CALLS + 1):
        torch.testing.assert_close(route(x), x * 2)
    assert not route.stats.traced_only
    assert route.stats.decisions[torch.get_num_threads()].choice == routing.ENGINE


def test_coverage_of_the_traced_path_keeps_fallbacks() -> None:
    x = torch.randn(4, 4).to(BF16)
    traced = _traced(lambda t: torch.relu(t * 2) * 3, x)
    route = LowPrecisionRoute(
        lambda t: t,
        traced,
        pending=lambda: False,
        engine="e",
        fallback_ops=Counter({"aten.mul.Tensor": 1, "aten.cos.default": 4}),
    )
    record = route.traced_record
    assert record.routed == Counter({"e:aten.mul.Tensor": 1, "e:aten.relu.default": 1})
    assert record.fallback == Counter({"aten.mul.Tensor": 1})


def test_reasons_not_to_measure() -> None:
    x = torch.randn(4, 4).to(BF16)
    plain = _traced(lambda t: t * 2, x)
    assert not_measured_reason(plain, "inference", "measure") is None
    assert "routing is off" in str(not_measured_reason(plain, "inference", "off"))
    assert "forward" in str(not_measured_reason(plain, "forward", "measure"))
    random = _traced(lambda t: torch.rand_like(t) + t, x)
    assert "random" in str(not_measured_reason(random, "inference", "measure"))
    writes = _traced(lambda t: t.mul_(2), x.clone())
    assert "writes into its inputs" in str(not_measured_reason(writes, "inference", "measure"))
    symbolic = make_fx(lambda t: t * 2, tracing_mode="symbolic")(x)
    assert not_measured_reason(symbolic, "inference", "measure") is None  # decided per shape


def test_copy_graph_is_independent() -> None:
    x = torch.randn(2, 2).to(BF16)
    gm = _traced(lambda t: t + 1, x)
    twin = low_precision_route.copy_graph(gm)
    for node in list(gm.graph.nodes):
        if node.op == "call_function":
            node.target = torch.ops.aten.sub.Tensor
    gm.recompile()
    torch.testing.assert_close(twin(x), x + 1)


def test_decision_is_reused_from_the_compile_cache(laggard: type[Laggard], tmp_path: Any) -> None:
    from torchburn.cache import configure

    configure(disk_dir=tmp_path)
    try:
        model, x = bf16_mlp()
        compiled, sink = compile_model(model, cache=True)
        with torch.no_grad():
            for _ in range(calls_to_decide()):
                compiled(x)
        assert sink[0].traced_only
        for fresh_memory in (False, True):  # a recompile; a new process (only the disk folder)
            if fresh_memory:
                configure(disk_dir=tmp_path)
            torch._dynamo.reset()
            compiled, sink = compile_model(model, cache=True)
            before = Laggard.calls
            with torch.no_grad():
                assert torch.equal(compiled(x), model(x))
            (report,) = sink
            decision = report.low_precision.decisions[torch.get_num_threads()]
            assert decision.source == "cache" and decision.choice == routing.EAGER
            assert Laggard.calls == before  # no settling, no measuring: the stored choice ran
    finally:
        configure(disk_dir=None)


def test_symbolic_sizes_are_decided_per_shape(laggard: type[Laggard]) -> None:
    model, _ = bf16_mlp()
    compiled, sink = compile_model(model, dynamic=True)
    with torch.no_grad():
        for batch in (3, 5):
            x = torch.randn(batch, 512).to(BF16)
            for _ in range(calls_to_decide()):
                torch.testing.assert_close(compiled(x), model(x), rtol=1.6e-2, atol=1e-2)
    stats = sink[-1].low_precision
    assert stats is not None
    threads = torch.get_num_threads()
    keys = {k for k in stats.decisions if isinstance(k, tuple)}
    assert {k[0] for k in keys} == {threads} and len(keys) == 2, stats.describe()
    assert stats.traced_only and "sizes" in stats.describe()


def test_a_changed_rewrite_measures_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored decision was measured on the pass's rewrite of its day: its key names the
    rewrite's version, so a changed rewrite (a new torchburn) decides afresh."""
    gm = make_fx(lambda x: (x * 2).relu(), tracing_mode="fake")(torch.randn(4).bfloat16())
    key = low_precision_route.decision_key(gm, ["tag"])
    assert low_precision_route.decision_key(gm, ["tag"]) == key
    monkeypatch.setattr(low_precision_route, "REWRITE_VERSION", low_precision_route.REWRITE_VERSION + 1)
    assert low_precision_route.decision_key(gm, ["tag"]) != key


@pytest.mark.parametrize("seconds", [2e-4, 1e-6, 3e-3])
def test_a_short_graph_measures_for_min_seconds(seconds: float) -> None:
    """Blocks of each path past BLOCKS while the timed calls add up to less than
    ``routing.MIN_SECONDS`` (at most MAX_BLOCKS each), always as many of each path."""
    from torchburn import low_precision_route as lpr
    from torchburn import routing

    run = lpr._Blocks()
    while True:
        path, timed = run.next_path()
        if timed:
            run.samples[path].append(seconds)
            if run.done():
                break
        assert run.calls <= lpr.MEASURE_CALLS
    total = sum(sum(v) for v in run.samples.values())
    timed_per_block = lpr.BLOCK - 1
    assert len(run.samples[routing.ENGINE]) == len(run.samples[routing.EAGER])
    blocks = len(run.samples[routing.ENGINE]) // timed_per_block
    if seconds == 3e-3:
        assert blocks == lpr.BLOCKS
    elif seconds == 1e-6:
        assert blocks == lpr.MAX_BLOCKS and total < routing.MIN_SECONDS
    else:
        assert lpr.BLOCKS < blocks < lpr.MAX_BLOCKS and total >= routing.MIN_SECONDS
        assert total - 2 * timed_per_block * seconds < routing.MIN_SECONDS  # one pair of blocks too many at most


class _Clock:
    """low_precision_route's ``time`` module, replaced: a clock only the paths move."""

    now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_a_close_choice_of_the_graph_as_traced_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The widened graph 15 % slower in the first window (a disturbance), faster afterwards: the
    graph as traced runs for RECHECK_CALLS calls, then a second window, and the two windows'
    samples together pin the widened graph; only that decision is stored."""
    clock = _Clock()
    monkeypatch.setattr(low_precision_route, "time", clock)
    x = torch.randn(4, 4).to(BF16)
    cost = {"wide": 0.0023, "traced": 0.002}
    calls = {"wide": 0}

    def wide(t: torch.Tensor) -> torch.Tensor:
        calls["wide"] += 1
        clock.now += cost["wide"]
        return t * 2

    def as_traced(t: torch.Tensor) -> torch.Tensor:
        clock.now += cost["traced"]
        return t * 2

    stored: list[Any] = []
    route = LowPrecisionRoute(
        wide,
        _traced(lambda t: t * 2, x),
        pending=lambda: False,
        engine="e",
        fallback_ops=Counter(),
        run_as_traced=as_traced,
        lookup=lambda key: None,
        store=lambda key, d: stored.append(d),
    )
    key = torch.get_num_threads()
    for _ in range(MEASURE_CALLS + 1):
        route(x)
        if key in route.stats.decisions:
            break
    first = route.stats.decisions[key]
    assert first.choice == routing.EAGER and first.provisional and route.stats.pending and stored == []
    assert "provisional" in route.stats.describe()
    cost["wide"] = 0.0012
    before = calls["wide"]
    for _ in range(routing.RECHECK_CALLS - 1):
        torch.testing.assert_close(route(x), x * 2)
    assert calls["wide"] == before  # the graph as traced alone meanwhile
    for _ in range(MEASURE_CALLS):
        route(x)
        if not route.stats.pending:
            break
    final = route.stats.decisions[key]
    assert final.choice == routing.ENGINE and not final.provisional and stored == [final]
