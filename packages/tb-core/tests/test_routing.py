"""Routing by measurement (torchburn.routing): a partition runs on its engine or in eager PyTorch,
whichever measured faster during its first calls.

Slowness here is structural, never a real kernel's speed: the "sleepy" engine's programs sleep
SLEEP seconds a call, and the ``tbroute::slow_double`` op's PyTorch kernel does. A sleep of 3 ms
against tens of microseconds of work cannot lose to noise, so nothing here can flake on timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import torch
import torch.fx

import torchburn
from torchburn import routing
from torchburn.cache import configure, graph_cache
from torchburn.options import Options
from torchburn.partition import GraphReport
from torchburn.plan import plan_from_graph_module

SLEEP = 0.003


@torch.library.custom_op("tbroute::slow_double", mutates_args=())
def slow_double(x: torch.Tensor) -> torch.Tensor:
    """PyTorch's kernel for this op is slow on purpose: eager loses to any engine that has one."""
    time.sleep(SLEEP)
    return x * 2


@slow_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


# An op with no CPU kernel in PyTorch at all (only a meta kernel for tracing): engine-only.
_LIB = torch.library.Library("tbroute", "FRAGMENT")
_LIB.define("engine_only(Tensor x) -> Tensor")
_LIB.impl("engine_only", lambda x: torch.empty_like(x), "Meta")


class Sleepy(torchburn.Engine):
    """A Python engine whose programs sleep ``sleep`` seconds per call (a slow engine), or only
    for inputs of at least ``sleep_from_rows`` rows; counts its program calls."""

    name = "sleepy"
    priority = 5
    sleep: ClassVar[float] = SLEEP
    sleep_from_rows: ClassVar[int] = 0
    calls: ClassVar[int] = 0

    def runs_registered_kernels(self) -> bool:
        return True  # compile wraps the default program, which runs the registry's table

    def compile(self, plan: torchburn.Plan) -> Any:
        program = super().compile(plan)

        def run(*args: Any) -> Any:
            Sleepy.calls += 1
            rows = next((a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.dim()), 0)
            if Sleepy.sleep and rows >= Sleepy.sleep_from_rows:
                time.sleep(Sleepy.sleep)
            return program(*args)

        return run


KERNELS: dict[str, Callable[..., Any]] = {
    "aten.add.Tensor": torch.ops.aten.add.Tensor,
    "aten.mul.Tensor": torch.ops.aten.mul.Tensor,
    "aten.relu.default": torch.ops.aten.relu.default,
    "aten.sigmoid.default": torch.ops.aten.sigmoid.default,
    "aten.copy_.default": torch.ops.aten.copy_.default,
    "aten.rand_like.default": torch.ops.aten.rand_like.default,
    "tbroute.slow_double.default": lambda x: x * 2,  # the engine's kernel: fast
    "tbroute.engine_only.default": lambda x: x + 1,
}


class SleepyPlugin:
    @torchburn.hookimpl
    def tb_register_engines(self) -> list[Any]:
        return [Sleepy]

    @torchburn.hookimpl
    def tb_register_kernels(self, registry: torchburn.KernelRegistry) -> None:
        for op, fn in KERNELS.items():
            registry.register("sleepy", op, fn, torchburn.accepts((torch.float32,)))


@pytest.fixture
def sleepy() -> Iterator[type[Sleepy]]:
    torchburn.register_plugin(SleepyPlugin(), "sleepy-plugin")
    Sleepy.sleep, Sleepy.sleep_from_rows, Sleepy.calls = SLEEP, 0, 0
    yield Sleepy


MEASURE = {"engine": "sleepy", "routing": "measure", "warn": False}


def compile_fn(fn: Callable[..., Any], **options: Any) -> tuple[Callable[..., Any], list[GraphReport]]:
    sink: list[GraphReport] = []
    dynamic = options.pop("dynamic", None)
    opts = {**MEASURE, "report_sink": sink, **options}
    return torch.compile(fn, backend="torchburn", options=opts, dynamic=dynamic), sink


def chain(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(torch.relu(x + 1) * 3)


def run_until_decided(fn: Callable[..., Any], args: tuple[Any, ...], reference: Callable[..., Any]) -> int:
    """Call until routing decided (at most MAX_CALLS + 2 calls); every output must be eager's."""
    for i in range(routing.MAX_CALLS + 2):
        torch.testing.assert_close(fn(*args), reference(*args))
        if i >= routing.MAX_CALLS:
            break
    return i + 1


def only_partition(sink: list[GraphReport]) -> Any:
    (graph,) = sink
    (part,) = graph.partitions
    return part


def test_slow_engine_is_routed_to_eager(sleepy: type[Sleepy]) -> None:
    fn, sink = compile_fn(chain)
    x = torch.randn(8, 16)
    run_until_decided(fn, (x,), chain)
    part = only_partition(sink)
    assert part.route is not None and part.route.measured
    decision = part.route.decisions[torch.get_num_threads()]
    assert decision.choice == "eager" and decision.engine_s > SLEEP * 0.9 > decision.eager_s
    assert part.routed and not part.ran
    # decided early (decisive after MIN_ROUNDS rounds): the engine ran its warm-up and 2 per round
    assert sleepy.calls == routing.WARMUP + 2 * routing.MIN_ROUNDS
    before = sleepy.calls
    torchburn.reset_stats()
    for _ in range(5):
        torch.testing.assert_close(fn(x), chain(x))
    assert sleepy.calls == before  # pinned: the engine is not called again
    cov = torchburn.op_coverage()
    assert cov["routed"] == {
        "aten.add.Tensor": 5,
        "aten.relu.default": 5,
        "aten.mul.Tensor": 5,
        "aten.sigmoid.default": 5,
    }
    assert cov["native"] == {} and cov["fallback"] == {}  # routed is not "fallback": the engine takes these ops
    assert sink[0].routed_ops()["aten.relu.default"] == 1 and not sink[0].native_ops()


def test_fast_engine_is_kept(sleepy: type[Sleepy]) -> None:
    sleepy.sleep = 0.0

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.tbroute.slow_double(x) + 1)

    def reference(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + 1)

    fn, sink = compile_fn(f)
    x = torch.randn(4, 8)
    run_until_decided(fn, (x,), reference)
    decision = only_partition(sink).route.decisions[torch.get_num_threads()]
    assert decision.choice == "engine" and decision.eager_s > SLEEP * 0.9 > decision.engine_s
    torchburn.reset_stats()
    calls = sleepy.calls
    start = time.perf_counter()
    for _ in range(5):
        torch.testing.assert_close(fn(x), reference(x))
    assert sleepy.calls == calls + 5
    assert time.perf_counter() - start < 5 * SLEEP  # eager's slow kernel no longer runs
    cov = torchburn.op_coverage()
    assert cov["native"]["tbroute.slow_double.default"] == 5 and cov["routed"] == {}


def test_measuring_calls_run_one_path_each(sleepy: type[Sleepy]) -> None:
    """Warm-ups engine then eager, then rounds engine, eager, eager, engine: each call one path."""
    fn, _ = compile_fn(chain)
    x = torch.randn(3, 5)
    paths = []
    for _ in range(2 * routing.WARMUP + 4 * routing.MIN_ROUNDS):
        before = sleepy.calls
        torch.testing.assert_close(fn(x), chain(x))
        paths.append("engine" if sleepy.calls > before else "eager")
    assert paths == ["engine", "eager"] + ["engine", "eager", "eager", "engine"] * routing.MIN_ROUNDS


def test_routing_off_keeps_the_engine(sleepy: type[Sleepy], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_ROUTING", "off")
    fn, sink = compile_fn(chain, routing=None)
    x = torch.randn(4, 4)
    for _ in range(routing.MAX_CALLS + 2):
        torch.testing.assert_close(fn(x), chain(x))
    part = only_partition(sink)
    assert sleepy.calls == routing.MAX_CALLS + 2
    assert not part.route.measured and "routing is off" in part.route.reason
    assert part.ran and not part.routed


def test_routing_option_and_env_var_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="routing option must be 'measure' or 'off'"):
        Options.from_user({"routing": "fastest"})
    with pytest.raises(ValueError, match="routing"):
        Options.from_user({"routing": 1})
    monkeypatch.setenv("TORCHBURN_ROUTING", "sometimes")
    with pytest.raises(ValueError, match="TORCHBURN_ROUTING must be 'measure' or 'off'"):
        Options.from_user({}).routing_mode()
    with pytest.raises(Exception, match="TORCHBURN_ROUTING must be 'measure' or 'off'"):
        torch.compile(chain, backend="torchburn")(torch.randn(3))
    monkeypatch.setenv("TORCHBURN_ROUTING", " OFF ")
    assert Options.from_user({}).routing_mode() == "off"
    assert Options.from_user({"routing": "measure"}).routing_mode() == "measure"
    monkeypatch.delenv("TORCHBURN_ROUTING")
    assert Options.from_user({}).routing_mode() == "measure"


def test_input_mutation_is_never_measured(sleepy: type[Sleepy]) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.copy_(y * 2)
        return torch.relu(y + 1)

    fn, sink = compile_fn(f, min_partition_size=1)
    x, y = torch.zeros(4), torch.randn(4)
    for _ in range(routing.MAX_CALLS):
        out = fn(x, y)
        torch.testing.assert_close(x, y * 2)
        torch.testing.assert_close(out, torch.relu(y + 1))
    routes = [p.route for g in sink for p in g.partitions if "aten.copy_.default" in p.ops]
    assert routes and all(not r.measured and "writes into its inputs (aten.copy_.default)" in r.reason for r in routes)


def test_random_ops_are_never_measured(sleepy: type[Sleepy]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.rand_like(x) + x)

    fn, sink = compile_fn(f)
    x = torch.randn(16)
    for _ in range(routing.MAX_CALLS):
        out = fn(x)
        assert ((out >= torch.relu(x)) & (out <= torch.relu(x + 1))).all()
    part = only_partition(sink)
    assert not part.route.measured and "draws random numbers (aten.rand_like.default)" in part.route.reason
    assert sleepy.calls == routing.MAX_CALLS


def test_engine_only_op_is_never_measured(sleepy: type[Sleepy]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.tbroute.engine_only(x) * 2)

    fn, sink = compile_fn(f)
    x = torch.randn(5)
    for _ in range(routing.MAX_CALLS):
        torch.testing.assert_close(fn(x), torch.relu((x + 1) * 2))
    part = only_partition(sink)
    assert not part.route.measured
    assert "tbroute.engine_only.default has no CPU kernel in PyTorch" in part.route.reason


def _graph(build: Callable[[torch.fx.Graph, torch.fx.Node], Any]) -> torch.fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    mode = FakeTensorMode()
    FakeTensorProp(gm, mode).propagate(mode.from_tensor(torch.randn(1, 1, 4, 4)))
    return gm


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda g, x: g.call_function(torch.ops.aten.relu.default, (x,)), None),
        (
            lambda g, x: g.call_function(torch.ops.aten.add_.Tensor, (x, 1.0)),
            "writes into its inputs (aten.add_.Tensor)",
        ),
        (
            lambda g, x: g.call_function(torch.ops.aten.native_dropout.default, (x, 0.5, True)),
            "draws random numbers (aten.native_dropout.default)",
        ),
        (
            lambda g, x: g.call_function(torch.ops.aten.bernoulli.p, (x, 0.5)),
            "draws random numbers (aten.bernoulli.p)",
        ),
        # dropout that cannot drop: inference graphs hold these, and they draw nothing
        (lambda g, x: g.call_function(torch.ops.aten.native_dropout.default, (x, 0.5, False)), None),
        (lambda g, x: g.call_function(torch.ops.aten.native_dropout.default, (x, 0.0, True)), None),
        (
            lambda g, x: g.call_function(
                torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, (x, x, x), {"dropout_p": 0.0}
            ),
            None,
        ),
        (
            lambda g, x: g.call_function(
                torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, (x, x, x, 0.1)
            ),
            "draws random numbers (aten._scaled_dot_product_flash_attention_for_cpu.default)",
        ),
        (
            lambda g, x: [
                g.call_function(
                    torch.ops.aten._assert_async.msg, (g.call_function(torch.ops.aten.any.default, (x,)), "m")
                ),
                x,
            ][1],
            "side effects (aten._assert_async.msg)",
        ),
    ],
)
def test_not_measured_reasons(build: Callable[..., Any], reason: str | None) -> None:
    gm = _graph(build)
    plan = plan_from_graph_module(gm)
    found = routing.not_measured_reason(gm, plan, "measure")
    assert (found is None) if reason is None else (found is not None and reason in found)
    assert "routing is off" in str(routing.not_measured_reason(gm, plan, "off"))


def test_decide_has_a_margin() -> None:
    assert routing.decide([1.0] * 5, [1.0] * 5) == "engine"
    assert routing.decide([1.02] * 5, [1.0] * 5) == "engine"  # within the 3% margin: the engine stays
    assert routing.decide([1.05] * 5, [1.0] * 5) == "eager"
    # the lower quartile: calls a busy machine descheduled (noise only adds time) do not decide
    assert routing.decide([1.0] * 4 + [9.0] * 4, [1.5] * 8) == "engine"
    assert routing.decide([2.0] * 8, [1.0] * 3 + [9.0] * 5) == "eager"
    assert routing.estimate([5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 8.0, 7.0]) == 3.0


def test_explain_shows_the_figures(sleepy: type[Sleepy]) -> None:
    report = torchburn.explain(chain, torch.randn(8, 8), options=MEASURE)
    text = str(report)
    assert f"routing: {torch.get_num_threads()} thread" in text
    assert "eager: engine " in text and ", eager " in text and "µs" in text and "eager faster by" in text
    assert report.routed_ops["aten.relu.default"] == 1 and not report.fully_native
    # without the structural cache nothing is looked up: the one call is a warm-up of the measurement
    one = torchburn.explain(chain, torch.randn(8, 8), options={**MEASURE, "cache": False}, measure=False)
    assert "measuring (1 of at most" in str(one)
    off = torchburn.explain(chain, torch.randn(8, 8), options={**MEASURE, "routing": "off"})
    assert "engine, not measured: routing is off" in str(off)


def test_eager_failure_pins_the_engine() -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no eager kernel here")

    route = routing.Route(lambda x: x + 1, broken, engine="fake", ops=["aten.add.Tensor"])
    x = torch.ones(3)
    outs = [route(x) for _ in range(6)]
    assert all(torch.equal(o, x + 1) for o in outs)
    assert "its eager sub-graph raised RuntimeError: no eager kernel here" in route.stats.reason
    assert not route.stats.pending


def test_engine_failure_runs_eager_from_then_on() -> None:
    calls = []

    def engine(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        raise RuntimeError("engine lost")

    route = routing.Route(engine, lambda x: x * 2, engine="fake", ops=["aten.mul.Tensor"])
    with pytest.warns(torchburn.TorchburnFallbackWarning, match="engine lost"):
        out = route(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0))
    for _ in range(5):
        assert torch.equal(route(torch.ones(2)), torch.full((2,), 2.0))
    assert len(calls) == 1 and "the engine failed while running" in route.stats.reason
    strict = routing.Route(engine, lambda x: x * 2, engine="fake", ops=[], strict=True)
    with pytest.raises(RuntimeError, match="engine lost"):
        strict(torch.ones(2))


def test_decisions_are_per_thread_count() -> None:
    threads = torch.get_num_threads()

    def slow_at(n: int, value: torch.Tensor) -> torch.Tensor:
        if torch.get_num_threads() == n:
            time.sleep(SLEEP)
        return value

    route = routing.Route(
        lambda x: slow_at(1, x + 1), lambda x: slow_at(2, x + 1), engine="fake", ops=["aten.add.Tensor"]
    )
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for _ in range(routing.MAX_CALLS):
                torch.testing.assert_close(route(torch.ones(2)), torch.full((2,), 2.0))
        assert route.stats.decisions[1].choice == "eager"
        assert route.stats.decisions[2].choice == "engine"
        assert "1 thread: eager" in route.stats.describe() and "2 threads: engine" in route.stats.describe()
    finally:
        torch.set_num_threads(threads)


def test_concurrent_calls_measure_and_decide_once(sleepy: type[Sleepy]) -> None:
    import threading

    fn, sink = compile_fn(chain)
    x = torch.randn(4, 4)
    fn(x)  # compiled once, before the threads
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(routing.MAX_CALLS):
                torch.testing.assert_close(fn(x), chain(x))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    assert only_partition(sink).route.decisions[torch.get_num_threads()].choice == "eager"


def test_dynamic_shapes_decide_per_shape(sleepy: type[Sleepy]) -> None:
    # eager's slow_double sleeps SLEEP; the engine sleeps 3 × SLEEP from 16 rows on, not below
    sleepy.sleep, sleepy.sleep_from_rows = 3 * SLEEP, 16

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.tbroute.slow_double(x) + 1)

    def reference(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + 1)

    fn, sink = compile_fn(f, dynamic=True)
    small, large = torch.randn(4, 8), torch.randn(32, 8)
    for x in (small, large):
        run_until_decided(fn, (x,), reference)
    part = only_partition(sink)
    assert part.shapes is not None and len(part.shapes.routes) == 2
    choices = {shape: r.decisions[torch.get_num_threads()].choice for shape, r in part.shapes.routes.items()}
    assert choices == {"[(4, 8)]": "engine", "[(32, 8)]": "eager"}
    assert "1 routed to eager" in part.shapes.describe()
    assert part.ran and part.routed
    text = str(torchburn.explain(f, small, options=MEASURE, dynamic=True))
    assert "routing for sizes [(4, 8)]: " in text and "engine faster by" in text


def test_decision_is_reused_from_the_memory_cache(sleepy: type[Sleepy]) -> None:
    fn, _ = compile_fn(chain)
    x = torch.randn(6, 6)
    run_until_decided(fn, (x,), chain)
    torch._dynamo.reset()
    sleepy.calls = 0
    again, sink = compile_fn(chain)
    for _ in range(3):
        torch.testing.assert_close(again(x), chain(x))
    decision = only_partition(sink).route.decisions[torch.get_num_threads()]
    assert decision.choice == "eager" and decision.source == "cache"
    assert sleepy.calls == 0  # no measurement: the engine never ran
    assert graph_cache().stats.route_hits >= 1


SECOND_PROCESS = textwrap.dedent(
    """
    import sys, torch, torchburn
    sys.path.insert(0, {tests!r})
    import test_routing as t
    torchburn.register_plugin(t.SleepyPlugin(), "sleepy-plugin")
    torch.set_num_threads({threads})
    sink = []
    fn = torch.compile(t.chain, backend="torchburn", options={{**t.MEASURE, "report_sink": sink}})
    x = torch.randn(6, 6)
    for _ in range(3):
        torch.testing.assert_close(fn(x), t.chain(x))
    d = sink[0].partitions[0].route.decisions[{threads}]
    print("DECISION", d.choice, d.source, t.Sleepy.calls)
    """
)


def test_decision_is_persisted_for_a_new_process(sleepy: type[Sleepy], tmp_path: Any) -> None:
    configure(disk_dir=tmp_path / "compile")
    fn, sink = compile_fn(chain)
    x = torch.randn(6, 6)
    run_until_decided(fn, (x,), chain)
    assert only_partition(sink).route.decisions[torch.get_num_threads()].choice == "eager"
    assert list((tmp_path / "compile").rglob("*.tbroute"))
    env = {**os.environ, "TORCHBURN_CACHE_DIR": str(tmp_path), "TORCHBURN_LOAD_PLUGINS": "__none__"}
    script = SECOND_PROCESS.format(tests=os.path.dirname(__file__), threads=torch.get_num_threads())
    with warnings.catch_warnings():
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "DECISION eager cache 0" in done.stdout, done.stdout + done.stderr


def test_corrupt_stored_decision_is_measured_again(sleepy: type[Sleepy], tmp_path: Any) -> None:
    configure(disk_dir=tmp_path)
    fn, _ = compile_fn(chain)
    x = torch.randn(6, 6)
    run_until_decided(fn, (x,), chain)
    (entry,) = tmp_path.rglob("*.tbroute")
    entry.write_bytes(entry.read_bytes()[:-3] + b"xx}")
    configure(disk_dir=tmp_path)  # a new process: nothing in memory
    torch._dynamo.reset()
    again, sink = compile_fn(chain)
    run_until_decided(again, (x,), chain)
    decision = only_partition(sink).route.decisions[torch.get_num_threads()]
    assert decision.choice == "eager" and decision.source == "measured"


def test_explain_calls_once_when_a_graph_draws_random_numbers(sleepy: type[Sleepy]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return chain(x) + torch.randn_like(x)  # randn_like: no kernel in sleepy, eager; the graph draws

    report = torchburn.explain(f, torch.randn(8, 8), options={**MEASURE, "cache": False})
    assert not report.graphs[0].repeatable
    assert sleepy.calls == 1 and "measuring (1 of at most" in str(report)


def test_training_graphs_are_not_replayed_by_explain(sleepy: type[Sleepy]) -> None:
    w = torch.randn(8, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return chain(x * w)

    report = torchburn.explain(f, torch.randn(8), options={**MEASURE, "cache": False})
    assert {g.kind for g in report.graphs} == {"forward"} and not report.graphs[0].repeatable
    assert sleepy.calls == 1


@pytest.mark.parametrize("seconds", [1e-4, 1e-6, 3e-3])
def test_a_measurement_spans_min_seconds_or_max_rounds(seconds: float) -> None:
    """Calls of 100 µs measure past ROUNDS rounds until the timed calls add up to MIN_SECONDS
    (one disturbance of a millisecond could otherwise fill a path's samples); calls of 1 µs stop
    at MAX_ROUNDS; calls of 3 ms decide after ROUNDS rounds (after MIN_ROUNDS when decisive)."""
    run = routing._Measurement()
    calls = 0
    while True:
        path, timed = run.next_path()
        calls += 1
        if timed:
            run.samples[path].append(seconds if path == "engine" else seconds * 1.1)
            if run.done():
                break
        assert calls <= routing.MAX_CALLS
    n = min(len(v) for v in run.samples.values())
    total = sum(sum(v) for v in run.samples.values())
    if seconds == 1e-6:
        assert n == 2 * routing.MAX_ROUNDS and total < routing.MIN_SECONDS
    elif seconds == 1e-4:
        assert 2 * routing.ROUNDS < n < 2 * routing.MAX_ROUNDS
        assert total >= routing.MIN_SECONDS and total - 4 * 1.1 * seconds < routing.MIN_SECONDS
    else:
        assert n == 2 * routing.ROUNDS
    assert routing.decide(run.samples["engine"], run.samples["eager"]) == "engine"


class _Clock:
    """routing's ``time`` module, replaced: a clock only the paths below move (no real timing)."""

    now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(routing, "time", fake)
    return fake


class _Timed:
    """A path that takes ``seconds`` a call on the fake clock (changeable), counting its calls."""

    def __init__(self, clock: _Clock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.clock.now += self.seconds
        return x + 1


def _close_then(clock: _Clock, engine_after: float) -> tuple[routing.Route, _Timed, _Timed, list[Any]]:
    """A route whose engine is slower than eager by less than DECISIVE during the first window
    (4 ms against 3.4 ms), and takes ``engine_after`` seconds from the second window on."""
    engine, eager = _Timed(clock, 0.004), _Timed(clock, 0.0034)
    stored: list[Any] = []
    route = routing.Route(
        engine,
        eager,
        engine="fake",
        ops=["aten.add.Tensor"],
        lookup=lambda t: None,
        store=lambda t, d: stored.append(d),
    )
    threads = torch.get_num_threads()
    x = torch.ones(2)
    while threads not in route.stats.decisions:  # the first window
        route(x)
    first = route.stats.decisions[threads]
    assert first.choice == "eager" and first.provisional and route.stats.pending
    assert stored == [] and "provisional: measured again" in route.stats.describe()
    engine.seconds = engine_after
    before = engine.calls
    for _ in range(routing.RECHECK_CALLS - 1):  # eager alone meanwhile
        torch.testing.assert_close(route(x), x + 1)
    assert engine.calls == before
    for _ in range(routing.MAX_CALLS + 1):  # the second window
        torch.testing.assert_close(route(x), x + 1)
        if not route.stats.pending:
            break
    assert not route.stats.pending
    return route, engine, eager, stored


def test_a_close_decision_for_eager_is_measured_again(clock: _Clock) -> None:
    """A disturbance that outlasts the first window (the engine's samples all slowed) cannot pin
    eager: the second window's samples, taken with the first's, find the engine faster."""
    route, engine, _, stored = _close_then(clock, 0.0015)
    final = route.stats.decisions[torch.get_num_threads()]
    assert final.choice == "engine" and not final.provisional
    assert stored == [final]  # only the final decision is kept
    calls = engine.calls
    route(torch.ones(2))
    assert engine.calls == calls + 1


def test_a_close_decision_for_eager_confirmed(clock: _Clock) -> None:
    route, engine, _, stored = _close_then(clock, 0.004)
    final = route.stats.decisions[torch.get_num_threads()]
    assert final.choice == "eager" and not final.provisional and stored == [final]
    calls = engine.calls
    for _ in range(routing.RECHECK_CALLS + 1):  # no third window
        route(torch.ones(2))
    assert engine.calls == calls and not route.stats.pending


def test_a_decisive_decision_for_eager_is_final_at_once(clock: _Clock) -> None:
    engine, eager = _Timed(clock, 0.006), _Timed(clock, 0.002)
    stored: list[Any] = []
    route = routing.Route(
        engine, eager, engine="fake", ops=[], lookup=lambda t: None, store=lambda t, d: stored.append(d)
    )
    for _ in range(routing.MAX_CALLS):
        route(torch.ones(2))
        if not route.stats.pending:
            break
    (decision,) = stored
    assert decision.choice == "eager" and not decision.provisional and not route.stats.pending
