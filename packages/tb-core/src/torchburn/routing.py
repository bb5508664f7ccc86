"""Engine or eager, per partition, chosen by measurement.

No static rule knows in advance whether an engine's kernels beat PyTorch's on a given partition at
given sizes (a convolution the engine lowers less well than oneDNN, a tiny MLP whose crossing costs
more than its arithmetic). So every compiled partition keeps, beside the engine's callable, its
eager sub-graph (the same FX sub-module the safe fallback runs), and during its first calls a
``Route`` times both on the real inputs, then pins the faster one:

* calls 1 and 2 warm up the engine, then eager; then rounds of engine, eager, eager, engine
  (``ROUNDS`` of them, at least ``MIN_ROUNDS``; it stops early once one path is ``DECISIVE`` times
  the other; either way not before the timed calls add up to ``MIN_SECONDS``, at most
  ``MAX_ROUNDS`` rounds). Each call runs one path only and returns that path's result, so nothing is computed
  twice and the extra cost of measuring is, per call, the difference between the two paths.
* each path's lower quartile decides (``estimate``): noise on a shared machine only ever adds time
  (a call descheduled for a time slice takes 5-9 ms more at a load of 7 on 2 cores, one call in
  five), and a median of a few samples half of which were hit is no estimate; the lowest quarter of
  the samples is. Eager is pinned only when the engine's estimate exceeds eager's by more than
  ``MARGIN`` (3 %), so noise does not flip a partition back and forth.
* decisions are per thread count (``torch.get_num_threads()``, read at each call: ~20 ns), kept with
  the compiled graph and in the compile cache (``GraphCache.load_route`` / ``store_route``: in
  memory and in the persistent cache folder) under the partition's structural key, which holds its
  shapes and engine, plus the engine's cache tag and the thread count; a later compile or process
  reuses them without measuring.

Never measured (the engine always runs, as without routing), with the reason kept for
``torchburn.explain``: routing off (``options={"routing": "off"}`` / ``TORCHBURN_ROUTING=off``, as
the engine test suites run), a partition that writes into its inputs or has another side effect,
one that draws random numbers (the two paths draw from different streams), inputs on a device
whose kernels run asynchronously (the wall clock would not time them), an op with no CPU kernel in
PyTorch (an engine-only op), and a partition whose eager sub-graph raises while measured.

``op_coverage()`` counts the nodes of a partition routed to eager as "routed" (an engine took and
compiled them; eager PyTorch measured faster), never as "fallback", which keeps meaning "no engine
takes it".
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import blake3
import torch
import torch.fx

from torchburn import telemetry
from torchburn.options import TorchburnFallbackWarning, routing_mode
from torchburn.plan import Plan, op_name

if TYPE_CHECKING:
    from torchburn.cache import GraphCache
    from torchburn.engine import Engine
    from torchburn.options import Options

#: Untimed calls of each path before the rounds (first-call allocations, oneDNN primitive creation).
WARMUP = 1
#: Rounds of engine, eager, eager, engine; the lower quartiles of 2 × ROUNDS samples of each path decide.
ROUNDS = 5
#: Rounds after which a decisive ratio ends the measurement early.
MIN_ROUNDS = 2
#: One path this many times slower than the other after MIN_ROUNDS rounds: decided.
DECISIVE = 1.25
#: Eager is pinned only when the engine is slower than eager by more than this fraction.
MARGIN = 0.03
#: Time the timed calls of both paths must add up to before a decision (after MIN_ROUNDS or
#: ROUNDS rounds): the measurement then spans at least this much wall time, so that one
#: disturbance (another process on a core for a millisecond, a burst of page faults) cannot fill
#: every sample of one path. A partition of 100 µs a call measured 10 samples a path in 2 ms, and
#: on a 2-core VM such a window pinned the slower path now and then (2026-12-07: the README
#: model under autocast at 2 threads routed to eager, 0.91× where the engine measures 1.9×).
MIN_SECONDS = 0.01
#: Rounds a measurement runs at most, short partitions included (MIN_SECONDS not reached).
MAX_ROUNDS = 25
#: The most calls a measurement takes (warm-ups and rounds).
MAX_CALLS = 2 * WARMUP + 4 * MAX_ROUNDS
#: A decision for eager by less than DECISIVE is provisional: eager runs for this many calls,
#: then both paths are measured once more and the two windows' samples together decide (and
#: only that decision is stored). On a shared machine a disturbance can outlast one window (a
#: process holding a core for a second): the engine's samples then all carry it, and the first
#: window alone pinned eager where the engine measures 1.2-1.9x faster (2026-12-07, 2 threads:
#: nn.TransformerEncoderLayer under autocast, the README model under autocast).
RECHECK_CALLS = 48
#: The most calls until a partition's final decision: two windows and the calls between them.
MAX_DECISION_CALLS = 2 * MAX_CALLS + RECHECK_CALLS
#: Version of what a stored decision means; part of its key (3: decisions span MIN_SECONDS;
#: 4: a close decision for eager is measured in two windows).
FORMAT = 4

ENGINE = "engine"
EAGER = "eager"

#: Calls made while a partition was still being measured, in this process (``measured_calls``).
_MEASURED_CALLS = 0


def measured_calls() -> int:
    """How many calls of compiled partitions ran while their route was still being measured (this
    route or the whole-graph one, ``torchburn.low_precision_route``), since the process started.

    A benchmark warms a compiled function until a call leaves this count unchanged: from then on
    it times the steady state, the path each partition pinned, not the measurement's mix of both."""
    return _MEASURED_CALLS


def _count_measured_call() -> None:
    global _MEASURED_CALLS
    _MEASURED_CALLS += 1


@dataclass
class Decision:
    choice: str  # ENGINE or EAGER
    engine_s: float  # seconds per call on the engine (lower quartile of the samples: ``estimate``)
    eager_s: float  # ... in eager PyTorch
    source: str = "measured"  # or "cache" (a former compile or process measured it)
    provisional: bool = False  # a close first window for eager: measured again RECHECK_CALLS calls later

    def describe(self) -> str:
        ratio = self.engine_s / self.eager_s if self.eager_s > 0 else float("inf")
        if self.choice == EAGER:
            why = f"eager faster by {100 * (1 - 1 / ratio):.0f}%" if ratio > 0 else "eager faster"
        elif ratio > 1:
            why = f"eager faster by only {100 * (1 - 1 / ratio):.1f}% (margin {100 * MARGIN:.0f}%)"
        else:
            why = f"engine faster by {100 * (1 - ratio):.0f}%"
        cached = ", from the compile cache" if self.source == "cache" else ""
        if self.provisional:
            cached += f"; provisional: measured again after {RECHECK_CALLS} calls"
        return f"{self.choice}: engine {format_seconds(self.engine_s)}, eager {format_seconds(self.eager_s)} ({why}{cached})"

    def to_json(self) -> dict[str, Any]:
        return {"choice": self.choice, "engine_s": self.engine_s, "eager_s": self.eager_s}

    @staticmethod
    def from_json(data: Any) -> Decision:
        if not isinstance(data, dict) or data.get("choice") not in (ENGINE, EAGER):
            raise ValueError("not a routing decision")
        engine_s, eager_s = float(data["engine_s"]), float(data["eager_s"])
        if not (engine_s >= 0 and eager_s >= 0):
            raise ValueError("negative or NaN time in a routing decision")
        return Decision(data["choice"], engine_s, eager_s, "cache")


def format_seconds(seconds: float) -> str:
    """µs below 10 ms, else ms (explain's routing lines)."""
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-2 else f"{seconds * 1e3:.2f} ms"


@dataclass
class RouteStats:
    """What routing did with one partition (live: decisions arrive with the calls), for ``explain``."""

    measured: bool  # False: never measured, the engine always runs
    reason: str = ""  # why not measured, or why measuring stopped (the eager sub-graph failed...)
    decisions: dict[int, Decision] = field(default_factory=dict)  # thread count -> decision
    measuring: dict[int, int] = field(default_factory=dict)  # thread count -> calls measured so far

    @property
    def pending(self) -> bool:
        """Still measuring at some thread count (or to measure again: a provisional decision), or
        measured but not yet called."""
        return (
            self.measured
            and not self.reason
            and (bool(self.measuring) or not self.decisions or any(d.provisional for d in self.decisions.values()))
        )

    @property
    def eager_only(self) -> bool:
        """Every decision so far is eager: the partition runs no engine kernel now."""
        return bool(self.decisions) and all(d.choice == EAGER for d in self.decisions.values())

    def describe(self) -> str:
        if not self.measured:
            return f"engine, not measured: {self.reason}"
        parts = [f"{n} thread{'s' if n != 1 else ''}: {d.describe()}" for n, d in sorted(self.decisions.items())]
        parts += [
            f"{n} thread{'s' if n != 1 else ''}: measuring ({calls} of at most {MAX_CALLS} calls)"
            for n, calls in sorted(self.measuring.items())
        ]
        if self.reason:
            parts.append(self.reason)
        return "; ".join(parts) or "not called yet"


def not_measured_reason(sub: torch.fx.GraphModule, plan: Plan, mode: str) -> str | None:
    """Why this partition must not be measured (the engine always runs it), or None."""
    if mode == "off":
        return "routing is off (options={'routing': 'off'} or TORCHBURN_ROUTING=off)"
    for node in sub.graph.nodes:
        if node.op != "call_function":
            continue
        effect = node_effect(node)
        if effect is not None:
            return effect
        if isinstance(node.target, torch._ops.OpOverload) and not runs_on_cpu(node.target):
            return f"{op_name(node.target)} has no CPU kernel in PyTorch (an engine-only op)"
    for meta in plan.inputs:
        if meta is not None and meta.device not in ("cpu", "meta"):
            return f"an input lives on {meta.device}: its kernels run asynchronously, the wall clock cannot time them"
    if any(m is not None and m.symbolic for m in plan.inputs):
        return "the engine takes its symbolic sizes as they are: one decision cannot fit every size"
    return None


def node_effect(node: torch.fx.Node) -> str | None:
    """What makes running ``node`` twice not the same as once: a write into its inputs, a random
    draw, another side effect; None for a pure node."""
    target = node.target
    name = op_name(target)
    if isinstance(target, torch._ops.OpOverload):
        if target._schema.is_mutable:
            return f"it writes into its inputs ({name})"
        if torch.Tag.nondeterministic_seeded in target.tags and _draws(node, target):
            return f"it draws random numbers ({name}): the two paths draw different streams"
    if _side_effect(node):
        return f"it has side effects ({name})"
    return None


def _side_effect(node: torch.fx.Node) -> bool:
    """FX's impure nodes, less random ops (``Node.is_impure`` counts them; ``_draws`` decides those)."""
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target in torch.fx.node._side_effectful_functions
    return node.is_impure()


def _draws(node: torch.fx.Node, op: torch._ops.OpOverload) -> bool:
    """Whether a node of a random op draws: attention with ``dropout_p=0`` and dropout with
    ``p=0`` or ``train=False`` (inference graphs hold them) do not."""
    values = {}
    for i, arg in enumerate(op._schema.arguments):
        if arg.name in node.kwargs:
            values[arg.name] = node.kwargs[arg.name]
        elif i < len(node.args) and not arg.kwarg_only:
            values[arg.name] = node.args[i]
        elif arg.has_default_value():
            values[arg.name] = arg.default_value
    if "dropout_p" in values:
        return bool(values["dropout_p"] != 0)
    if "p" in values and "train" in values:
        return values["train"] is not False and bool(values["p"] != 0)
    return True


def runs_on_cpu(op: torch._ops.OpOverload) -> bool:
    """PyTorch has a CPU kernel for ``op`` (eager PyTorch can run it on CPU tensors)."""
    if op.namespace in ("aten", "prims"):
        return True
    name = op.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return any(has(name, key) for key in ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd"))


def route_key(plan_key: str, engine_tag: str, threads: int) -> str:
    """The key of a stored decision: the partition's structural key (its ops, shapes, engine and
    versions), the engine's cache tag (build, ISA), the thread count, the machine."""
    material = [plan_key, engine_tag, threads, FORMAT, platform.machine(), os.cpu_count()]
    return blake3.blake3(json.dumps(material).encode()).hexdigest()


def estimate(samples: Sequence[float]) -> float:
    """Seconds per call of a path: the lower quartile of its samples (noise only adds time)."""
    return sorted(samples)[len(samples) // 4]


def decide(engine: Sequence[float], eager: Sequence[float]) -> str:
    """EAGER when the engine's estimate exceeds eager's by more than ``MARGIN``, else ENGINE."""
    return EAGER if estimate(engine) > estimate(eager) * (1 + MARGIN) else ENGINE


def _decisive(engine: Sequence[float], eager: Sequence[float]) -> bool:
    e, x = estimate(engine), estimate(eager)
    return e > x * DECISIVE or x > e * DECISIVE


def needs_second_window(engine: Sequence[float], eager: Sequence[float]) -> bool:
    """A first window that chose eager by less than ``DECISIVE``: measured again (RECHECK_CALLS)."""
    return decide(engine, eager) == EAGER and not _decisive(engine, eager)


def countdown(fn: Callable[..., Any], calls: int, then: Callable[[], None]) -> Callable[..., Any]:
    """``fn``, which calls ``then()`` once, on its ``calls``-th call (before running). Its calls
    count as measured calls (``measured_calls``): the decision is not final yet."""
    left = calls

    def run(*args: Any) -> Any:
        nonlocal left
        _count_measured_call()
        left -= 1
        if left == 0:
            then()
        return fn(*args)

    return run


class Window:
    """One measurement window's calls and samples per path; ``first``: the samples of the window
    before, when this is the second (``RECHECK_CALLS``). Schedules subclass it."""

    __slots__ = ("calls", "first", "samples")

    def __init__(self, first: dict[str, list[float]] | None = None) -> None:
        self.calls = 0
        self.first = first
        self.samples: dict[str, list[float]] = {ENGINE: [], EAGER: []}

    def all_samples(self, path: str) -> list[float]:
        """This window's samples of ``path`` and the first window's."""
        return (self.first[path] if self.first is not None else []) + self.samples[path]


class _Measurement(Window):
    """The schedule of one partition's measurement at one thread count."""

    __slots__ = ()

    def next_path(self) -> tuple[str, bool]:
        """The path of the next call and whether its time counts (False: a warm-up)."""
        i = self.calls
        self.calls += 1
        if i < 2 * WARMUP:
            return (ENGINE if i % 2 == 0 else EAGER), False
        return (ENGINE if (i - 2 * WARMUP) % 4 in (0, 3) else EAGER), True

    def done(self) -> bool:
        engine, eager = self.samples[ENGINE], self.samples[EAGER]
        n = min(len(engine), len(eager))
        if n >= 2 * MAX_ROUNDS:
            return True
        if n % 2 or sum(engine) + sum(eager) < MIN_SECONDS:
            return False  # whole rounds only; too short a window yet
        if n >= 2 * ROUNDS:
            return True
        return n >= 2 * MIN_ROUNDS and _decisive(engine, eager)


class _Always:
    """A pin table that gives the same path at every thread count (after a failure)."""

    __slots__ = ("value",)

    def __init__(self, value: tuple[Callable[..., Any], telemetry.GraphRecord]) -> None:
        self.value = value

    def get(self, _threads: int) -> tuple[Callable[..., Any], telemetry.GraphRecord]:
        return self.value


Store = Callable[[int, Decision], None]
Lookup = Callable[[int], "Decision | None"]


class Route:
    """The callable that replaces a measured partition in the graph: the engine's program or the
    eager sub-graph, whichever measured faster at the calling thread count."""

    def __init__(
        self,
        engine_fn: Callable[..., Any],
        eager_fn: Callable[..., Any],
        *,
        engine: str,
        ops: Sequence[str],
        delegated: frozenset[str] = frozenset(),
        lookup: Lookup | None = None,
        store: Store | None = None,
        strict: bool = False,
    ) -> None:
        self.engine_fn = engine_fn
        self.eager_fn = eager_fn
        self.engine = engine
        self.stats = RouteStats(measured=True)
        self._lookup = lookup
        self._store = store
        self._strict = strict
        counted = [op for op in ops if op != "getitem"]
        self.engine_record = telemetry.new_record(
            Counter(f"{engine}:{op}" for op in counted if op not in delegated),
            Counter(),
            Counter(f"{engine}:{op}" for op in counted if op in delegated),
        )
        self.eager_record = telemetry.new_record(
            Counter(), Counter(), routed=Counter(f"{engine}:{op}" for op in counted)
        )
        self._pinned: Any = {}  # thread count -> (callable, record); or an _Always after a failure
        self._runs: dict[int, _Measurement] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        pinned = self._pinned.get(torch.get_num_threads())
        if pinned is None:
            return self._measured_call(args)
        fn, record = pinned
        record.calls += 1
        if record is self.eager_record:
            return fn(*args)
        try:
            return fn(*args)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # a native panic (pyo3's PanicException) is a BaseException
            return self._engine_failed(exc, args)

    # -- measuring ---------------------------------------------------------------------------
    def _measured_call(self, args: tuple[Any, ...]) -> Any:
        _count_measured_call()
        threads = torch.get_num_threads()
        with self._lock:
            run = self._runs.get(threads)
            if run is None and isinstance(self._pinned, dict) and threads not in self._pinned:
                decision = self._lookup(threads) if self._lookup is not None else None
                if decision is not None:
                    self._pin(threads, decision)
                else:
                    run = self._runs[threads] = _Measurement()
            if run is None:  # pinned meanwhile (another thread, or the cache)
                path, timed = None, False
            else:
                path, timed = run.next_path()
                self.stats.measuring[threads] = run.calls
        if path is None:
            return self(*args)
        start = time.perf_counter()
        if path == EAGER:
            try:
                out = self.eager_fn(*args)
            except Exception as exc:
                self._eager_failed(exc)
                return self(*args)
            elapsed = time.perf_counter() - start
            self.eager_record.calls += 1
        else:
            try:
                out = self.engine_fn(*args)
            except (KeyboardInterrupt, SystemExit, GeneratorExit):
                raise
            except BaseException as exc:
                return self._engine_failed(exc, args)
            elapsed = time.perf_counter() - start
            self.engine_record.calls += 1
        if timed:
            self._sample(threads, run, path, elapsed)  # type: ignore[arg-type]
        return out

    def _sample(self, threads: int, run: _Measurement, path: str, elapsed: float) -> None:
        decision = None
        with self._lock:
            if self._runs.get(threads) is not run:
                return  # decided (or failed) meanwhile
            run.samples[path].append(elapsed)
            if run.done():
                engine, eager = run.all_samples(ENGINE), run.all_samples(EAGER)
                decision = Decision(decide(engine, eager), estimate(engine), estimate(eager))
                if run.first is None and needs_second_window(engine, eager):
                    self._pin_for_now(threads, decision, run.samples)
                    return  # not stored: the second window decides
                self._pin(threads, decision)
        if decision is not None and self._store is not None:
            self._store(threads, decision)

    def _pin_for_now(self, threads: int, decision: Decision, first: dict[str, list[float]]) -> None:
        """Eager for ``RECHECK_CALLS`` calls, then a second measurement. Called with the lock held."""
        self._runs.pop(threads, None)
        self.stats.measuring.pop(threads, None)
        self.stats.decisions[threads] = replace(decision, provisional=True)
        entry: tuple[Callable[..., Any], Any] = (self.eager_fn, self.eager_record)

        def measure_again() -> None:
            with self._lock:
                if not isinstance(self._pinned, dict) or self._pinned.get(threads) is not entry:
                    return  # failed or re-pinned meanwhile
                self._runs[threads] = _Measurement(first)
                self._pinned = {k: v for k, v in self._pinned.items() if k != threads}

        entry = (countdown(self.eager_fn, RECHECK_CALLS, measure_again), self.eager_record)
        if isinstance(self._pinned, dict):
            self._pinned = {**self._pinned, threads: entry}

    def _pin(self, threads: int, decision: Decision) -> None:
        """Called with the lock held."""
        self._runs.pop(threads, None)
        self.stats.measuring.pop(threads, None)
        self.stats.decisions[threads] = decision
        if isinstance(self._pinned, dict):
            path = (
                (self.eager_fn, self.eager_record) if decision.choice == EAGER else (self.engine_fn, self.engine_record)
            )
            # a new dict, not an update: __call__ reads the table without the lock
            self._pinned = {**self._pinned, threads: path}

    # -- failures ------------------------------------------------------------------------------
    def _eager_failed(self, exc: Exception) -> None:
        """The eager sub-graph cannot run these inputs: the engine runs this partition from now on."""
        with self._lock:
            self._runs.clear()
            self.stats.measuring.clear()
            self.stats.reason = (
                f"not measured further: its eager sub-graph raised {type(exc).__name__}: {exc}; the engine runs it"
            )
            self._pinned = _Always((self.engine_fn, self.engine_record))

    def _engine_failed(self, exc: BaseException, args: tuple[Any, ...]) -> Any:
        """The engine's program failed: eager PyTorch runs this partition from now on (or raise)."""
        if self._strict:
            raise exc
        with self._lock:
            first = not isinstance(self._pinned, _Always) or self._pinned.value[0] is not self.eager_fn
            self._runs.clear()
            self.stats.measuring.clear()
            self.stats.reason = f"the engine failed while running ({type(exc).__name__}: {exc}); eager from now on"
            self._pinned = _Always((self.eager_fn, self.eager_record))
        if first:
            warnings.warn(
                f"torchburn engine {self.engine!r} failed while running a partition "
                f"({type(exc).__name__}: {exc}); this partition runs in eager PyTorch from now on",
                TorchburnFallbackWarning,
                stacklevel=3,
            )
        self.eager_record.calls += 1
        return self.eager_fn(*args)


__all__ = [
    "MAX_CALLS",
    "MAX_DECISION_CALLS",
    "RECHECK_CALLS",
    "Decision",
    "Route",
    "RouteStats",
    "build_route",
    "decide",
    "estimate",
    "measured_calls",
    "node_effect",
    "not_measured_reason",
    "route_key",
    "routing_mode",
]


def build_route(
    compiled: Callable[..., Any],
    eager_fn: Callable[..., Any],
    sub: torch.fx.GraphModule,
    plan: Plan,
    *,
    engine: Engine,
    opts: Options,
    cache: GraphCache,
    delegated: frozenset[str],
    plan_key: Callable[[], str | None],
) -> tuple[Route | None, RouteStats]:
    """The Route of a compiled partition (``sub``: the static graph ``plan`` was made from), or None
    with the reason it is not measured."""
    from torchburn.cache import engine_tag

    mode = opts.routing_mode()
    try:
        reason = not_measured_reason(sub, plan, mode)
    except Exception as exc:  # a node the checks cannot read: the engine runs it, as without routing
        reason = f"its nodes could not be checked ({type(exc).__name__}: {exc})"
    if reason is not None:
        return None, RouteStats(measured=False, reason=reason)
    lookup: Lookup | None = None
    store: Store | None = None
    if opts.cache:
        keys: dict[int, str | None] = {}

        def key_of(threads: int) -> str | None:
            if threads not in keys:
                try:
                    base = plan_key()
                    keys[threads] = route_key(base, engine_tag(engine), threads) if base is not None else None
                except Exception:  # a plan without a canonical form: decided in memory only
                    keys[threads] = None
            return keys[threads]

        def lookup(threads: int) -> Decision | None:
            key = key_of(threads)
            data = cache.load_route(key) if key is not None else None
            try:
                return Decision.from_json(data) if data is not None else None
            except (ValueError, KeyError, TypeError):
                return None

        def store(threads: int, decision: Decision) -> None:
            key = key_of(threads)
            if key is not None:
                cache.store_route(key, decision.to_json())

    route = Route(
        compiled,
        eager_fn,
        engine=engine.name,
        ops=list(plan.ops()),
        delegated=delegated,
        lookup=lookup,
        store=store,
        strict=opts.fallback == "error",
    )
    return route, route.stats
