"""Partitions with symbolic sizes, compiled once per concrete shape behind a small LRU.

When Dynamo marks a dimension dynamic (the second distinct size it sees, or ``dynamic=True``
from the first call), the graph it hands over has symbolic sizes: ``SymInt`` shapes and strides,
views whose sizes are ``SymInt`` values, and the ``SymInt`` arguments AOTAutograd passes
explicitly. Engines decide on static nodes, so the partitioner offers each symbolic node as its
hint (``NodeInfo.hinted``: the sizes of the example Dynamo traced with), and a partition taken
that way becomes a ``SpecialisedPartition``.

At each call it reads the concrete sizes and strides of its symbolic tensor inputs and the values
of its symbolic scalar inputs (one tuple, the signature) and runs the engine's program for exactly
that signature. The first call with a signature builds it: the partition's sub-graph with every
symbolic scalar input replaced by the call's value, metas propagated again on fake tensors of the
call's inputs (so every size, stride and view is static), every node checked again by the engine
on those sizes, then compiled as a static partition through the structural cache. Programs are
kept in an LRU of ``shape_cache_size`` entries per partition (``TORCHBURN_SHAPE_CACHE_SIZE``).

A signature the engine refuses (an empty tensor it does not take, say), or that fails to
specialise or compile, runs the partition's eager sub-graph for the calls with that signature:
counted as fallback in ``op_coverage``, its reason kept for ``explain``. Never a wrong answer.
"""

from __future__ import annotations

import operator
import threading
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from torchburn import telemetry
from torchburn.nodeinfo import NodeInfo
from torchburn.options import TorchburnFallbackWarning
from torchburn.plan import GETITEM, Plan, TensorMeta, op_name, plan_from_graph_module

#: Compiles a static plan: (the engine's callable, the ops it delegates to PyTorch's kernels).
CompilePlan = Callable[[Plan], tuple[Callable[..., Any], frozenset[str]]]
Checker = Callable[[NodeInfo], "str | None"]
#: Routes one signature's program (``torchburn.routing``): (the static graph, its plan, the program
#: taking every argument, delegated ops) -> (the callable to run instead, or None; its stats).
RoutePlan = Callable[
    [torch.fx.GraphModule, Plan, Callable[..., Any], frozenset[str]], tuple["Callable[..., Any] | None", Any]
]

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
MAX_REASONS = 8  # eager signatures whose reason the report keeps


class SpecialisationRefused(Exception):
    """The engine does not take one node of the partition at these concrete sizes."""


@dataclass
class ShapeStats:
    """What a specialised partition did, for ``explain`` (live: it changes with every new shape)."""

    bound: int
    compiled: int = 0  # signatures compiled for the engine
    eager: int = 0  # signatures that run the eager sub-graph
    evictions: int = 0
    entries: int = 0
    eager_reasons: dict[str, str] = field(default_factory=dict)  # signature -> why it runs eagerly
    # signature -> its routing.RouteStats (engine or eager by measurement, per shape), the first MAX_REASONS
    routes: dict[str, Any] = field(default_factory=dict)

    @property
    def routed_eager(self) -> int:
        """Compiled signatures that eager PyTorch measured faster (among those ``routes`` keeps)."""
        return sum(1 for r in self.routes.values() if r.eager_only)

    def describe(self) -> str:
        text = f"specialised per shape: {self.compiled} shape{'s' if self.compiled != 1 else ''} compiled"
        if self.routed_eager:
            text += f" ({self.routed_eager} routed to eager, measured faster)"
        if self.eager:
            text += f", {self.eager} eager"
        text += f", {self.entries} cached (bound {self.bound})"
        if self.evictions:
            text += f", {self.evictions} evicted"
        return text


class _Entry:
    __slots__ = ("pick", "record", "routed", "run")

    def __init__(self, run: Callable[..., Any] | None, keep: tuple[int, ...], record: telemetry.GraphRecord) -> None:
        self.run = run  # None: the eager sub-graph, with every argument
        self.routed: Callable[..., Any] | None = None  # a routing.Route taking every argument (it counts its calls)
        self.record = record
        # the arguments ``run`` takes (the tensors; the sizes are baked in), picked in C
        getter = operator.itemgetter(*keep) if keep else (lambda args: ())
        self.pick: Callable[[Sequence[Any]], tuple[Any, ...]] = (
            (lambda args: (getter(args),)) if len(keep) == 1 else getter  # type: ignore[assignment]
        )


class SpecialisedPartition:
    """The callable that replaces a partition with symbolic sizes in the graph."""

    def __init__(
        self,
        sub: torch.fx.GraphModule,
        *,
        engine: str,
        check: Checker,
        compile_plan: CompilePlan,
        bound: int,
        strict: bool = False,
        warn: bool = True,
        on_compiled: Callable[[frozenset[str]], None] | None = None,
        route: RoutePlan | None = None,
    ) -> None:
        if bound < 1:
            raise ValueError("a specialised partition needs a cache of at least one entry")
        self.eager = sub
        self.engine = engine
        self._check = check
        self._compile_plan = compile_plan
        self._strict = strict
        self._warn = warn
        self._on_compiled = on_compiled
        self._route = route
        self.stats = ShapeStats(bound)
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        self._records: dict[Any, telemetry.GraphRecord] = {}
        self._lock = threading.Lock()
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        self._arity = len(placeholders)
        # Only the inputs whose meta is symbolic take part in the signature: every other input
        # has the static sizes the graph was traced with (Dynamo's guards and the trace say so).
        self._tensors: list[int] = []
        self._scalars: list[int] = []
        for i, ph in enumerate(placeholders):
            val = ph.meta.get("val")
            if isinstance(val, torch.Tensor):
                if TensorMeta.of(val).symbolic:
                    self._tensors.append(i)
            else:
                self._scalars.append(i)
        self.ops = [
            op_name(n.target) for n in sub.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
        ]

        self.signature = _signature_function(self._tensors, self._scalars)

    # -- the call ----------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        key = self.signature(args)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._miss(key, args)
        else:
            try:  # noqa: SIM105 (contextlib.suppress costs a context manager on every call)
                self._entries.move_to_end(key)
            except KeyError:  # another thread evicted it meanwhile: this call still uses it
                pass
        if entry.run is None:
            entry.record.calls += 1
            return self.eager(*args)
        if entry.routed is not None:
            return entry.routed(*args)
        try:
            out = entry.run(*entry.pick(args))
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # a native panic (pyo3's PanicException) is a BaseException
            if self._strict:
                raise
            entry = self._broken(key, exc)
            entry.record.calls += 1
            return self.eager(*args)
        entry.record.calls += 1
        return out

    def cached_signatures(self) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._entries)

    # -- a new signature ---------------------------------------------------------------------
    def _miss(self, key: tuple[Any, ...], args: Sequence[Any]) -> _Entry:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._build(key, args)
                self._entries[key] = entry
                while len(self._entries) > self.stats.bound:
                    self._entries.popitem(last=False)
                    self.stats.evictions += 1
                self.stats.entries = len(self._entries)
            return entry

    def _build(self, key: tuple[Any, ...], args: Sequence[Any]) -> _Entry:
        try:
            gm, keep = specialise_graph(self.eager, args)
            for node in gm.graph.nodes:
                if node.op == "call_function" and node.target is not operator.getitem:
                    reason = self._check(NodeInfo.of(node))
                    if reason is not None:
                        raise SpecialisationRefused(f"{op_name(node.target)}: {reason}")
            plan = plan_from_graph_module(gm)
            run, delegated = self._compile_plan(plan)
        except SpecialisationRefused as exc:
            return self._eager_entry(key, f"{self.engine}: {exc}")
        except Exception as exc:
            if self._strict:
                raise
            return self._eager_entry(key, f"could not specialise for these sizes ({type(exc).__name__}: {exc})")
        self.stats.compiled += 1
        if self._on_compiled is not None:
            self._on_compiled(delegated)
        ops = [n.op for n in plan.nodes if n.op != GETITEM]
        native = Counter(f"{self.engine}:{op}" for op in ops if op not in delegated)
        handed = Counter(f"{self.engine}:{op}" for op in ops if op in delegated)
        record = self._record(("engine", tuple(sorted(native.items())), tuple(sorted(handed.items()))), native, handed)
        entry = _Entry(run, keep, record)
        if self._route is not None:
            pick = entry.pick

            def full(*args: Any) -> Any:
                return run(*pick(args))

            try:
                entry.routed, stats = self._route(gm, plan, full, delegated)
            except Exception as exc:
                if self._strict:
                    raise
                entry.routed, stats = None, None
                warnings.warn(
                    f"torchburn: routing failed ({type(exc).__name__}: {exc})", TorchburnFallbackWarning, stacklevel=4
                )
            if stats is not None and len(self.stats.routes) < MAX_REASONS:
                self.stats.routes[describe_signature(key, len(self._tensors))] = stats
        return entry

    def _broken(self, key: tuple[Any, ...], exc: BaseException) -> _Entry:
        """The engine's program failed at run time: this signature runs eagerly from now on."""
        with self._lock:
            self.stats.compiled -= 1
            entry = self._eager_entry(key, f"failed while running ({type(exc).__name__}: {exc})")
            if key in self._entries:
                self._entries[key] = entry
            return entry

    def _eager_entry(self, key: tuple[Any, ...], reason: str) -> _Entry:
        self.stats.eager += 1
        shown = describe_signature(key, len(self._tensors))
        if len(self.stats.eager_reasons) < MAX_REASONS:
            self.stats.eager_reasons[shown] = reason
        if self._warn and self.stats.eager == 1:
            warnings.warn(
                f"torchburn: a partition of {len(self.ops)} ops runs in eager PyTorch for the sizes {shown} "
                f"({reason}); other sizes still run on {self.engine!r}",
                TorchburnFallbackWarning,
                stacklevel=4,
            )
        record = self._record(("eager",), fallback=Counter(self.ops))
        return _Entry(None, tuple(range(self._arity)), record)

    def _record(
        self,
        key: Any,
        native: Counter[str] | None = None,
        delegated: Counter[str] | None = None,
        fallback: Counter[str] | None = None,
    ) -> telemetry.GraphRecord:
        # one telemetry record per distinct count, shared by the signatures that have it, and
        # kept when an entry is evicted (op_coverage counts calls since reset_stats)
        record = self._records.get(key)
        if record is None:
            record = telemetry.new_record(native or Counter(), fallback or Counter(), delegated or Counter())
            self._records[key] = record
        return record


def _signature_function(tensors: list[int], scalars: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``args -> (sizes and strides of each symbolic tensor input, ..., value of each scalar input, ...)``.

    It runs on every call, so the common layouts get a function without loops."""
    if len(tensors) == 1 and len(scalars) <= 1:
        (t,) = tensors
        if not scalars:
            return lambda args: ((args[t].shape, args[t].stride()),)
        (n,) = scalars
        return lambda args: ((args[t].shape, args[t].stride()), args[n])

    def signature(args: Sequence[Any]) -> tuple[Any, ...]:
        return (*((args[i].shape, args[i].stride()) for i in tensors), *(args[i] for i in scalars))

    return signature


def specialise_graph(sub: torch.fx.GraphModule, args: Sequence[Any]) -> tuple[torch.fx.GraphModule, tuple[int, ...]]:
    """``sub`` for these arguments: each non-tensor input replaced by its value and dropped from
    the inputs, every node's meta recomputed on fake tensors shaped as ``args``' tensors.

    Returns the static graph module and the indices of ``args`` it takes.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(args) != len(placeholders):
        raise TypeError(f"the partition takes {len(placeholders)} arguments, got {len(args)}")
    graph = torch.fx.Graph()
    val_map: dict[torch.fx.Node, Any] = {}
    keep: list[int] = []
    for i, (ph, arg) in enumerate(zip(placeholders, args)):
        if isinstance(arg, torch.Tensor):
            new = graph.placeholder(ph.name)
            new.meta = dict(ph.meta)
            val_map[ph] = new
            keep.append(i)
        elif isinstance(arg, (int, float, bool)) or arg is None:
            val_map[ph] = arg
        else:
            raise TypeError(f"partition input {ph.name} is a {type(arg).__name__}, not a tensor or a number")
    graph.output(graph.graph_copy(sub.graph, val_map))
    gm = torch.fx.GraphModule(sub, graph)
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(args[i]) for i in keep]
    with torch.no_grad():
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        leaves = val if isinstance(val, (tuple, list)) else (val,)
        if any(isinstance(v, _SYMBOLIC) for v in leaves) or any(
            isinstance(v, torch.Tensor) and TensorMeta.of(v).symbolic for v in leaves
        ):
            raise ValueError(f"{node.name} is still symbolic after specialisation")
    return gm, tuple(keep)


def describe_signature(key: tuple[Any, ...], tensors: int) -> str:
    parts = []
    for i, part in enumerate(key):
        if i < tensors:
            shape, stride = part
            parts.append(f"{tuple(shape)}" + ("" if _contiguous(tuple(shape), tuple(stride)) else f" stride {stride}"))
        else:
            parts.append(repr(part))
    return "[" + ", ".join(parts) + "]"


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    return TensorMeta(shape, stride, torch.float32, "cpu").is_contiguous


__all__ = ["ShapeStats", "SpecialisedPartition", "specialise_graph"]
