"""Widened or as traced: a bfloat16 / float16 inference graph keeps the low-precision pass only
where it measures faster.

``torchburn.low_precision`` rewrites bfloat16 / float16 compute to float32 between casts so the
engines run it. Whether that pays depends on the machine: where PyTorch's own bfloat16 kernels are
slow (a CPU without bfloat16 dot products, where oneDNN widens too) the engines win by several
times; where oneDNN runs bfloat16 on AMX tiles, its convolutions and GEMMs can beat the widened
float32 kernels by 2x. Partition-level routing (``torchburn.routing``) cannot see that: the eager
alternative of a widened partition is itself widened.

So an inference graph the pass changed keeps the graph as traced beside the widened one, and a
``LowPrecisionRoute`` chooses between them by measurement, per thread count:

* first the widened graph runs alone until its partitions' own routing has decided (at most
  ``SETTLE_CALLS`` calls, at each thread count: partitions route per thread count too, and a
  partition still measuring at the new count would run its eager path inside the widened
  graph's samples), so what is compared is the widened graph as it will run;
* then it times the widened graph against the graph as traced, run by eager PyTorch in its own
  dtype, in blocks of ``BLOCK`` consecutive calls of one path (the first of each untimed: a switch
  of paths costs the next call, which neither path pays once chosen), ``BLOCKS`` blocks each or
  more until the timed calls add up to ``routing.MIN_SECONDS`` (at most ``MAX_BLOCKS``), and
  pins the faster with the lower-quartile estimates and margin of a partition's routing
  (``routing.decide``).

Decisions are kept with the compiled graph and in the compile cache (``GraphCache.store_route``,
in memory and on disk) under ``decision_key``: the graph as traced, its inputs and the engines'
cache tags, plus the thread count; a later compile or process pins the stored choice at its first
call, without settling or measuring.

Both paths return the same dtypes, and each call runs one path only. Nodes of the graph as traced
count as "routed" in ``op_coverage()`` when that path runs (an engine took them, eager PyTorch
measured faster), except those the widened graph would run in eager anyway, which stay "fallback".
A graph with symbolic sizes (dynamic shapes) is decided per concrete shape of its inputs, at most
``MAX_KEYS`` of them. Not measured (the widened graph always runs): routing off, training graphs,
and graphs that draw random numbers or write into their inputs (the same reasons as a
partition's).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import blake3
import torch
import torch.fx

from torchburn import autocast_state, routing, telemetry
from torchburn.low_precision import REWRITE_VERSION
from torchburn.plan import op_name

#: The most calls the widened graph runs alone, waiting for its partitions' routing to decide.
SETTLE_CALLS = routing.MAX_DECISION_CALLS + 2
#: Consecutive calls of one path while measuring (the first of them untimed), and blocks per path
#: (at least BLOCKS; more, up to MAX_BLOCKS, until the timed calls add up to
#: ``routing.MIN_SECONDS``: a short graph's measurement must outlast a disturbance too).
BLOCK = 4
BLOCKS = 3
MAX_BLOCKS = 12
#: Calls the comparison takes (one window).
MEASURE_CALLS = 2 * MAX_BLOCKS * BLOCK
#: The most calls until the final decision: two windows and the calls between them.
MAX_DECISION_CALLS = 2 * MEASURE_CALLS + routing.RECHECK_CALLS
#: Thread counts and shapes (a graph with symbolic sizes) measured at most; beyond them a new
#: shape takes the choice most of the measured ones made.
MAX_KEYS = 16

_SKIPPED = frozenset({"getitem"})


@dataclass
class LowPrecisionStats:
    """What the choice between the widened graph and the graph as traced did, for ``explain``
    (live). Keys are thread counts, or (thread count, input sizes) for a graph with symbolic sizes,
    which is decided per concrete shape."""

    ops: list[str]  # the compute nodes of the graph as traced
    #: True: the low-precision pass widened the compiled graph; False: a float32 graph of direct
    #: inference, compiled as it is, against Dynamo's graph in eager PyTorch.
    widened: bool = True
    decisions: dict[Hashable, routing.Decision] = field(default_factory=dict)
    measuring: dict[Hashable, int] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        """Still measuring somewhere (or to measure again: a provisional decision), or not yet
        decided anywhere."""
        return bool(self.measuring) or not self.decisions or any(d.provisional for d in self.decisions.values())

    @property
    def traced_only(self) -> bool:
        """Every decision so far is the graph as traced: no engine runs any of it."""
        return bool(self.decisions) and all(d.choice == routing.EAGER for d in self.decisions.values())

    def describe(self) -> str:
        parts = []
        mine = "widened" if self.widened else "compiled"
        for key, d in self.decisions.items():
            chosen = "as traced (eager PyTorch)" if d.choice == routing.EAGER else f"{mine} (engines)"
            cached = ", from the compile cache" if d.source == "cache" else ""
            if d.provisional:
                cached += f"; provisional: measured again after {routing.RECHECK_CALLS} calls"
            parts.append(
                f"{_where(key)}: {chosen}; {mine} {routing.format_seconds(d.engine_s)}, as traced {routing.format_seconds(d.eager_s)}{cached}"
            )
        parts += [
            f"{_where(key)}: measuring ({calls} of {MEASURE_CALLS} calls)" for key, calls in self.measuring.items()
        ]
        return "; ".join(parts) or f"{mine}, waiting for its partitions' routing"


def _where(key: Hashable) -> str:
    threads, sizes = key if isinstance(key, tuple) else (key, None)
    text = f"{threads} thread{'s' if threads != 1 else ''}"
    return f"{text}, sizes {list(sizes)}" if sizes is not None else text


def copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """An independent copy of ``gm`` (the pass rewrites its graph in place)."""
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def not_measured_reason(gm: torch.fx.GraphModule, kind: str, mode: str) -> str | None:
    """Why the widened graph must run without comparing it to the graph as traced, or None."""
    if mode == "off":
        return "routing is off"
    if kind != "inference":
        return f"a {kind} graph (only inference graphs are compared)"
    for node in gm.graph.nodes:
        if node.op == "call_function":
            effect = routing.node_effect(node)
            if effect is not None:
                return effect
            if isinstance(node.target, torch._ops.OpOverload) and not routing.runs_on_cpu(node.target):
                return f"{op_name(node.target)} has no CPU kernel in PyTorch (an engine-only op)"
        elif node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.device.type not in ("cpu", "meta"):
                return (
                    f"an input lives on {val.device}: its kernels run asynchronously, the wall clock cannot time them"
                )
    return None


def decision_key(traced: torch.fx.GraphModule, engine_tags: list[str]) -> str:
    """What a stored decision is about: the graph as traced (its nodes and its inputs' dtypes,
    sizes and strides), the engines in force (their cache tags: builds, ISA) and the autocast state
    it was compiled under. ``routing.route_key`` adds the thread count and the machine."""
    metas: list[Any] = []
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                metas.append([str(val.dtype), list(val.shape), list(val.stride()), str(val.device)])
            else:
                metas.append(repr(val))
    # the pass's rewrite is part of what the widened graph was: a changed rewrite measures again;
    # the graph as traced is autocast's input, so the same graph under autocast is another route
    material = json.dumps(
        [
            "low_precision_route",
            1,
            REWRITE_VERSION,
            _canonical(traced),
            metas,
            engine_tags,
            autocast_state.state(),
        ],
        default=str,
    )
    return blake3.blake3(material.encode()).hexdigest()


def _canonical(gm: torch.fx.GraphModule) -> list[Any]:
    """The graph's nodes in order, each an (op, target, args, kwargs) with other nodes as their
    positions: the same for a graph traced now and one restored from the compile cache, whose
    node names differ."""
    index = {node: i for i, node in enumerate(gm.graph.nodes)}

    def ref(a: torch.fx.Node) -> Any:
        return f"%{index[a]}"

    return [
        [n.op, str(n.target), repr(torch.fx.map_arg(n.args, ref)), repr(torch.fx.map_arg(n.kwargs, ref))]
        for n in gm.graph.nodes
    ]


def traced_ops(gm: torch.fx.GraphModule) -> list[str]:
    return [
        op
        for node in gm.graph.nodes
        if node.op == "call_function"
        and (op := op_name(node.target)) not in _SKIPPED
        and not op.startswith("aten.sym_")
    ]


class LowPrecisionRoute:
    """The callable of a graph the low-precision pass changed: the widened graph (``wide``: its
    partitions on the engines) or ``traced`` (the ATen graph as traced, eager PyTorch), whichever
    measured faster at the calling thread count. ``run_as_traced``: what runs for ``traced``, when
    a graph computing the same from the same arguments runs faster (direct inference's Dynamo
    graph: ``linear`` where the ATen graph has ``permute`` and ``addmm``)."""

    def __init__(
        self,
        wide: Callable[..., Any],
        traced: torch.fx.GraphModule,
        *,
        pending: Callable[[], bool],
        engine: str,
        fallback_ops: Counter[str],
        run_as_traced: Callable[..., Any] | None = None,
        lookup: Callable[[Hashable], routing.Decision | None] | None = None,
        store: Callable[[Hashable, routing.Decision], None] | None = None,
        symbolic: bool = False,
        widened: bool = True,
    ) -> None:
        self.wide = wide
        self._pending = pending
        ops = traced_ops(traced)
        counts = Counter(ops)
        # ops the widened graph leaves to eager stay fallback on this path too (as many as it has)
        fallback = Counter({op: min(n, counts[op]) for op, n in fallback_ops.items() if counts[op]})
        routed = Counter({f"{engine}:{op}": n - fallback[op] for op, n in counts.items() if n > fallback[op]})
        self.traced_record = telemetry.new_record(Counter(), fallback, routed=routed)
        forward = run_as_traced if run_as_traced is not None else traced.forward

        def run_traced(*args: Any) -> Any:
            self.traced_record.calls += 1
            return forward(*args)

        self.traced = run_traced
        self.stats = LowPrecisionStats(ops, widened)
        self._symbolic = symbolic
        # settling calls so far per key (thread count / shape): each key's partitions decide
        # their own routes (routing is per thread count), so each key settles on its own
        self._settling: dict[Hashable, int] = {}
        self._settled: set[Hashable] = set()
        self._pinned: dict[Hashable, Callable[..., Any]] = {}
        self._runs: dict[Hashable, _Blocks] = {}
        self._lock = threading.Lock()
        self._lookup = lookup
        self._store = store
        self._looked_up: set[Hashable] = set()

    def _key(self, args: tuple[Any, ...]) -> Hashable:
        threads = torch.get_num_threads()
        if not self._symbolic:
            return threads
        return threads, tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)

    def __call__(self, *args: Any) -> Any:
        key = self._key(args)
        pinned = self._pinned.get(key)
        if pinned is not None:
            return pinned(*args)
        if self._lookup is not None and key not in self._looked_up:
            self._looked_up.add(key)
            decision = self._lookup(key)  # a former compile or process measured it
            if decision is not None:
                with self._lock:
                    self._pin(key, decision)
                return self._pinned[key](*args)
        if key not in self._settled:
            settling = self._settling.get(key, 0)
            if settling < SETTLE_CALLS and self._pending():
                self._settling[key] = settling + 1
                routing._count_measured_call()
                return self.wide(*args)
            self._settled.add(key)
        if len(self._pinned) + len(self._runs) >= MAX_KEYS and key not in self._runs:
            return self._beyond_bound(args)
        return self._measured_call(key, args)

    def _beyond_bound(self, args: tuple[Any, ...]) -> Any:
        """A shape beyond the ``MAX_KEYS`` measured: the choice most shapes measured made."""
        choices = Counter(d.choice for d in self.stats.decisions.values())
        traced = choices[routing.EAGER] > choices[routing.ENGINE]
        return self.traced(*args) if traced else self.wide(*args)

    def _measured_call(self, key: Hashable, args: tuple[Any, ...]) -> Any:
        routing._count_measured_call()
        with self._lock:
            run = self._runs.setdefault(key, _Blocks())
            path, timed = run.next_path()
            self.stats.measuring[key] = run.calls
        fn = self.traced if path == routing.EAGER else self.wide
        start = time.perf_counter()
        out = fn(*args)
        elapsed = time.perf_counter() - start
        if timed:
            with self._lock:
                if self._runs.get(key) is run:
                    run.samples[path].append(elapsed)
                    if run.done():
                        wide, traced = run.all_samples(routing.ENGINE), run.all_samples(routing.EAGER)
                        decision = routing.Decision(
                            routing.decide(wide, traced), routing.estimate(wide), routing.estimate(traced)
                        )
                        if run.first is None and routing.needs_second_window(wide, traced):
                            self._pin_for_now(key, decision, run.samples)
                        else:
                            self._pin(key, decision)
                            if self._store is not None:
                                self._store(key, decision)
        return out

    def _pin_for_now(self, key: Hashable, decision: routing.Decision, first: dict[str, list[float]]) -> None:
        """The graph as traced for ``routing.RECHECK_CALLS`` calls, then a second measurement whose
        samples and ``first``'s decide. Called with the lock held."""
        self._runs.pop(key, None)
        self.stats.measuring.pop(key, None)
        self.stats.decisions[key] = replace(decision, provisional=True)

        def measure_again() -> None:
            with self._lock:
                if self._pinned.get(key) is not entry:
                    return
                self._runs[key] = _Blocks(first)
                self._pinned = {k: v for k, v in self._pinned.items() if k != key}

        entry = routing.countdown(self.traced, routing.RECHECK_CALLS, measure_again)
        self._pinned = {**self._pinned, key: entry}

    def _pin(self, key: Hashable, decision: routing.Decision) -> None:
        """Called with the lock held."""
        self._runs.pop(key, None)
        self.stats.measuring.pop(key, None)
        self.stats.decisions[key] = decision
        chosen = self.traced if decision.choice == routing.EAGER else self.wide
        self._pinned = {**self._pinned, key: chosen}  # a new dict: read without the lock


class _Blocks(routing.Window):
    """The schedule and samples of one measurement: blocks of ``BLOCK`` consecutive calls of one
    path, widened and as traced in the order W T T W W T ...; the first call of a block is not
    timed. Consecutive calls because switching paths costs the next call (the other path's
    caches, OpenMP's threads asleep while the engine's pool ran), which neither path pays once
    chosen."""

    __slots__ = ()

    def next_path(self) -> tuple[str, bool]:
        block, at = divmod(self.calls, BLOCK)
        self.calls += 1
        path = routing.ENGINE if block % 4 in (0, 3) else routing.EAGER
        return path, at > 0

    def done(self) -> bool:
        if self.calls < 2 * BLOCKS * BLOCK or self.calls % (2 * BLOCK):
            return False  # as many blocks of each path, at least BLOCKS
        measured = sum(self.samples[routing.ENGINE]) + sum(self.samples[routing.EAGER])
        return measured >= routing.MIN_SECONDS or self.calls >= MEASURE_CALLS


__all__ = [
    "MAX_DECISION_CALLS",
    "MEASURE_CALLS",
    "SETTLE_CALLS",
    "LowPrecisionRoute",
    "LowPrecisionStats",
    "copy_graph",
    "not_measured_reason",
]
