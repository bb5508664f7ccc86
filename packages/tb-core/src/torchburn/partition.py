"""Partition an ATen graph across engines, compile each partition, leave the rest eager.

Each engine, in priority order, claims the nodes it accepts; torch's capability-based
partitioner groups them into connected, cycle-free partitions; partitions too small to pay for
the crossing stay eager. Each kept partition becomes a ``Plan``, is looked up in the structural
cache or compiled by its engine, and replaces its sub-graph with one call. Everything left is
plain eager PyTorch inside the same FX graph.
"""

from __future__ import annotations

import copy
import logging
import operator
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from torchburn import catalog, routing, telemetry
from torchburn._version import PLUGIN_API_VERSION
from torchburn.cache import graph_cache
from torchburn.engine import Engine
from torchburn.nodeinfo import NodeInfo
from torchburn.options import Options, TorchburnFallbackWarning
from torchburn.plan import GETITEM, Plan, op_name, plan_from_graph_module
from torchburn.specialise import ShapeStats, SpecialisedPartition

log = logging.getLogger("torchburn")

HEAVY_CATEGORIES = frozenset({"gemm", "conv_pool", "attention", "normalization", "reduction", "loss", "backward"})
FREE_CATEGORIES = frozenset({"view"})
#: Size arithmetic and shape assertions in graphs with symbolic sizes: they read a tensor's metadata
#: or check a size, compute nothing, run in Python, and are not counted as fallback ops.
SIZE_OPS = frozenset(
    {
        "aten.sym_size.int",
        "aten.sym_stride.int",
        "aten.sym_numel.default",
        "aten.sym_storage_offset.default",
        "aten._assert_scalar.default",
        "aten.sym_constrain_range.default",
        "aten.sym_constrain_range_for_size.default",
    }
)


@dataclass
class PartitionReport:
    engine: str
    ops: list[str]
    # "compiled", "cache hit", "specialised per shape", "below cost threshold", "compile failed: ..."
    status: str
    delegated: frozenset[str] = frozenset()  # ops the engine hands to PyTorch's kernels (Engine.delegated_ops)
    shapes: ShapeStats | None = None  # a partition with symbolic sizes: what its shape cache holds (live)
    route: routing.RouteStats | None = None  # engine or eager by measurement (live; torchburn.routing)

    @property
    def ran(self) -> bool:
        """The engine runs this partition (for some shapes, at some thread count)."""
        if self.shapes is not None:
            return self.shapes.compiled > self.shapes.routed_eager
        return self.status in ("compiled", "cache hit") and not (self.route is not None and self.route.eager_only)

    @property
    def routed(self) -> bool:
        """Compiled, but eager PyTorch measured faster at every thread count decided so far."""
        if self.shapes is not None:
            return self.shapes.routed_eager > 0
        return self.status in ("compiled", "cache hit") and self.route is not None and self.route.eager_only


@dataclass
class GraphReport:
    kind: str  # "forward", "backward", "inference"
    partitions: list[PartitionReport] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (op, reason)
    engines: list[str] = field(default_factory=list)
    #: An inference graph that writes no input, draws no random number and has no other side
    #: effect: calling it again changes nothing (``explain`` may call it until routing decides).
    repeatable: bool = False
    #: A bfloat16 / float16 graph the low-precision pass widened, run widened or as traced by
    #: measurement (``torchburn.low_precision_route.LowPrecisionStats``; live), or None.
    low_precision: Any = None

    @property
    def traced_only(self) -> bool:
        """The graph as traced (eager PyTorch, its own dtype) measured faster than the widened graph
        at every thread count decided so far: no partition runs."""
        return self.low_precision is not None and self.low_precision.traced_only

    def native_ops(self) -> Counter[str]:
        """Nodes engines ran with their own kernels."""
        c: Counter[str] = Counter()
        if self.traced_only:
            return c
        for p in self.partitions:
            if p.ran:
                c.update(op for op in p.ops if op != GETITEM and op not in p.delegated)
        return c

    def delegated_ops(self) -> Counter[str]:
        """Nodes engines took but ran with PyTorch's own kernels."""
        c: Counter[str] = Counter()
        if self.traced_only:
            return c
        for p in self.partitions:
            if p.ran:
                c.update(op for op in p.ops if op != GETITEM and op in p.delegated)
        return c

    def routed_ops(self) -> Counter[str]:
        """Nodes of partitions an engine compiled that run in eager PyTorch, measured faster there."""
        c: Counter[str] = Counter()
        if self.traced_only:
            c.update(self.low_precision.ops)
            c.subtract(Counter(op for op, _ in self.fallbacks))  # eager's on either path
            return +c
        for p in self.partitions:
            if p.routed and p.shapes is None:
                c.update(op for op in p.ops if op != GETITEM)
        return c

    def pending_routes(self) -> bool:
        """Some partition (or the choice of the low-precision pass) is still being measured (or not
        yet called)."""
        if self.low_precision is not None and self.low_precision.pending:
            return True
        return self.partitions_pending()

    def partitions_pending(self) -> bool:
        """Some partition is still being measured (or not yet called)."""
        return any(
            (p.route is not None and p.route.pending)
            or (p.shapes is not None and any(r.pending for r in p.shapes.routes.values()))
            for p in self.partitions
        )

    def engine_ops(self) -> Counter[str]:
        """Nodes an engine took, native or delegated (everything that did not fall back)."""
        return self.native_ops() + self.delegated_ops()


def is_compute(op: str) -> bool:
    return op != GETITEM and catalog.category(op) not in FREE_CATEGORIES


def worth_a_partition(ops: list[str], min_size: int, work: int = 0, min_work: int = 0) -> bool:
    """A partition is worth a kernel call when it holds a heavy op (GEMM, convolution, attention,
    a norm, a reduction, a loss, a backward), ``min_size`` compute ops or more, or, with
    ``min_work`` set, when its compute ops write ``min_work`` elements or more."""
    if any(catalog.category(op) in HEAVY_CATEGORIES for op in ops):
        return True
    if sum(1 for op in ops if is_compute(op)) >= min_size:
        return True
    return min_work > 0 and work >= min_work


def partition_work(nodes: Any) -> int:
    """Elements the compute nodes of a partition write (their outputs' numel, by the size hints
    where sizes are symbolic): what an elementwise partition costs, roughly."""
    total = 0
    for n in nodes:
        if n.op != "call_function" or not is_compute(op_name(n.target)):
            continue
        val = n.meta.get("val")
        for v in val if isinstance(val, (list, tuple)) else (val,):
            if isinstance(v, torch.Tensor):
                total += _numel_hint(v)
    return total


def _numel_hint(t: torch.Tensor) -> int:
    count = 1
    for s in t.shape:
        if isinstance(s, int):
            count *= s
        else:  # a SymInt: its hint (the example Dynamo traced with), else count it as large
            hint = getattr(getattr(s, "node", None), "hint", None)
            count *= int(hint) if isinstance(hint, int) else 1 << 16
    return count


class _EngineSupport(OperatorSupportBase):
    """Asks the engine about each node. A node with symbolic sizes the engine does not take as it
    is (few engines do) is asked again as its hint, the static node of the example Dynamo traced
    with, when shape specialisation is on; its name then goes into ``hinted``."""

    def __init__(
        self,
        engine: Engine,
        infos: dict[torch.fx.Node, NodeInfo],
        reasons: dict[str, list[str]],
        specialise: bool = True,
        hinted: set[str] | None = None,
    ) -> None:
        self.engine = engine
        self.infos = infos
        self.reasons = reasons
        self.memo: dict[torch.fx.Node, bool] = {}
        self.specialise = specialise
        self.hinted = hinted if hinted is not None else set()

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node in self.memo:
            return self.memo[node]
        if node.target is operator.getitem:
            parent = node.args[0]
            ok = isinstance(parent, torch.fx.Node) and self.is_node_supported(submodules, parent)
        elif not isinstance(node.target, torch._ops.OpOverload):
            ok = False
            self.reasons.setdefault(node.name, []).append(f"{self.engine.name}: not an ATen op")
        elif str(node.target) in SIZE_OPS:
            ok = False
        else:
            info = self.infos.get(node) or self.infos.setdefault(node, NodeInfo.of(node))
            reason = self._ask(info)
            if reason is not None and info.symbolic and self.specialise:
                hint = NodeInfo.hinted(node)
                reason = hint if isinstance(hint, str) else self._ask(hint)
                if reason is None:
                    self.hinted.add(node.name)
            ok = reason is None
            if not ok:
                self.reasons.setdefault(node.name, []).append(f"{self.engine.name}: {reason}")
        self.memo[node] = ok
        return ok

    def _ask(self, info: NodeInfo) -> str | None:
        try:
            return self.engine.check(info)
        except Exception as exc:  # a buggy checker means "no", not a crash
            return f"checker raised {type(exc).__name__}: {exc}"


def compile_graph(
    gm: torch.fx.GraphModule, engines: list[Engine], opts: Options, kind: str
) -> tuple[Callable[..., Any], GraphReport]:
    """Return (callable taking the graph's inputs, report). Never raises for engine trouble."""
    report = GraphReport(kind, engines=[e.name for e in engines], repeatable=_repeatable(gm, kind))
    if not engines:
        _record_fallbacks(gm, report, {}, "no engine selected")
        return gm, report
    work = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    try:
        _partition_and_compile(work, engines, opts, report)
        return work, report
    except Exception as exc:
        if opts.fallback == "error":
            raise
        warnings.warn(
            f"torchburn could not partition this {kind} graph ({type(exc).__name__}: {exc}); it runs in eager PyTorch",
            TorchburnFallbackWarning,
            stacklevel=2,
        )
        report = GraphReport(kind, engines=[e.name for e in engines])
        _record_fallbacks(gm, report, {}, f"partitioning failed: {exc}")
        return gm, report


def _repeatable(gm: torch.fx.GraphModule, kind: str) -> bool:
    if kind != "inference":  # forward / backward graphs: autograd accumulates gradients at each call
        return False
    return all(routing.node_effect(node) is None for node in gm.graph.nodes if node.op == "call_function")


def _partition_and_compile(gm: torch.fx.GraphModule, engines: list[Engine], opts: Options, report: GraphReport) -> None:
    # Fusing re-creates the graph's nodes (a topological re-sort copies them), so anything kept
    # across engine passes is keyed by node name, which the copy preserves.
    reasons: dict[str, list[str]] = {}
    small: dict[str, str] = {}
    cache = graph_cache()
    specialise = opts.shape_cache_bound() > 0
    for index, engine in enumerate(engines):
        hinted: set[str] = set()
        support = _EngineSupport(engine, {}, reasons, specialise, hinted)
        partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
        proposed = partitioner.propose_partitions()
        kept = []
        for part in proposed:
            ops = [op_name(n.target) for n in part.nodes]
            work = partition_work(part.nodes)
            if worth_a_partition(ops, opts.min_partition_size, work, opts.min_partition_work):
                kept.append(part)
            else:
                for n in part.nodes:
                    small[n.name] = (
                        f"{engine.name}: below cost threshold ({sum(1 for op in ops if is_compute(op))} compute ops "
                        f"< min_partition_size={opts.min_partition_size}, {work} elements written "
                        f"< min_partition_work={opts.min_partition_work})"
                    )
        if not kept:
            continue
        for part in kept:
            for n in part.nodes:
                small.pop(n.name, None)
        prefix = f"tb_{index}_{engine.name}_"
        partitioner.fuse_partitions(kept, prefix=prefix)
        for node in list(gm.graph.nodes):
            if node.op == "call_module" and str(node.target).startswith(prefix):
                sub = getattr(gm, str(node.target))
                if any(n.name in hinted for n in sub.graph.nodes):
                    _specialise_partition(gm, node, engine, opts, cache, report)
                else:
                    _compile_partition(gm, node, engine, opts, cache, report)
    gm.graph.lint()
    gm.recompile()
    for node, reason in small.items():
        reasons[node] = [reason]
    _record_fallbacks(gm, report, reasons, "no engine accepts it", engines, specialise)


def _compile_partition(
    gm: torch.fx.GraphModule, node: torch.fx.Node, engine: Engine, opts: Options, cache: Any, report: GraphReport
) -> None:
    sub = getattr(gm, str(node.target))
    plan = plan_from_graph_module(sub)
    ops = list(plan.ops())
    try:
        compiled, status, key = _compile_plan(plan, engine, opts, cache)
    except Exception as exc:
        if opts.fallback == "error":
            raise
        status = f"compile failed: {type(exc).__name__}: {exc}"
        warnings.warn(
            f"torchburn engine {engine.name!r} failed to compile a partition of {len(ops)} ops "
            f"({type(exc).__name__}: {exc}); it runs in eager PyTorch",
            TorchburnFallbackWarning,
            stacklevel=2,
        )
        report.partitions.append(PartitionReport(engine.name, ops, status))
        return  # the fused sub-module stays in the graph and runs eagerly
    delegated = _delegated(engine, plan)
    part = PartitionReport(engine.name, ops, status, delegated)
    report.partitions.append(part)
    route, part.route = routing.build_route(
        compiled,
        sub.forward,
        sub,
        plan,
        engine=engine,
        opts=opts,
        cache=cache,
        delegated=delegated,
        plan_key=lambda: key,
    )
    if route is not None:
        route.__name__ = route.__qualname__ = f"tb_{engine.name}_routed_partition_{len(report.partitions)}"  # type: ignore[attr-defined]
        _replace(gm, node, route)
    else:
        _replace(gm, node, _runner(compiled, sub, engine.name, len(report.partitions), opts))


def _plan_key(plan: Plan, engine: Engine) -> str:
    return plan.key(engine.name, engine.version(), torch.__version__, str(PLUGIN_API_VERSION))


def _compile_plan(plan: Plan, engine: Engine, opts: Options, cache: Any) -> tuple[Callable[..., Any], str, str | None]:
    """The engine's callable for ``plan`` (through the structural cache), "compiled" / "cache hit",
    and the structural key (None without the cache)."""
    if not opts.cache:
        return engine.compile(plan), "compiled", None
    key = _plan_key(plan, engine)
    hits_before = cache.stats.hits + cache.stats.disk_hits
    compiled = cache.get_or_compile(key, engine, plan)
    return compiled, "cache hit" if cache.stats.hits + cache.stats.disk_hits > hits_before else "compiled", key


def _specialise_partition(
    gm: torch.fx.GraphModule, node: torch.fx.Node, engine: Engine, opts: Options, cache: Any, report: GraphReport
) -> None:
    """A partition the engine took on its nodes' hints: compiled per concrete signature at call time."""
    sub = getattr(gm, str(node.target))
    part = PartitionReport(engine.name, [op_name(n.target) for n in sub.graph.nodes if n.op == "call_function"], "")

    def compile_plan(plan: Plan) -> tuple[Callable[..., Any], frozenset[str]]:
        return _compile_plan(plan, engine, opts, cache)[0], _delegated(engine, plan)

    def on_compiled(delegated: frozenset[str]) -> None:
        part.delegated = part.delegated | delegated

    def check(info: NodeInfo) -> str | None:
        return engine.check(info)

    def route(
        static: torch.fx.GraphModule, plan: Plan, run: Callable[..., Any], delegated: frozenset[str]
    ) -> tuple[Callable[..., Any] | None, routing.RouteStats]:
        # one decision per concrete shape: the eager side is the symbolic sub-graph, with every argument
        return routing.build_route(
            run,
            sub.forward,
            static,
            plan,
            engine=engine,
            opts=opts,
            cache=cache,
            delegated=delegated,
            plan_key=lambda: _plan_key(plan, engine),
        )

    specialised = SpecialisedPartition(
        sub,
        engine=engine.name,
        check=check,
        compile_plan=compile_plan,
        bound=opts.shape_cache_bound(),
        strict=opts.fallback == "error",
        warn=opts.warn,
        on_compiled=on_compiled,
        route=route,
    )
    part.status = "specialised per shape"
    part.shapes = specialised.stats
    report.partitions.append(part)
    _replace(gm, node, _runner(specialised, sub, engine.name, len(report.partitions), opts))


def _replace(gm: torch.fx.GraphModule, node: torch.fx.Node, runner: Callable[..., Any]) -> None:
    with gm.graph.inserting_before(node):
        call = gm.graph.call_function(runner, tuple(node.args), dict(node.kwargs))
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    gm.graph.erase_node(node)
    # Keep the eager sub-module reachable from the runner only.
    delattr(gm, str(node.target))


def _delegated(engine: Engine, plan: Plan) -> frozenset[str]:
    try:
        return frozenset(engine.delegated_ops(plan))
    except Exception as exc:  # telemetry must not break a compile: count the whole partition as delegated
        log.warning("engine %s: delegated_ops raised %s: %s", engine.name, type(exc).__name__, exc)
        return frozenset(plan.ops())


def _runner(
    compiled: Callable[..., Any], eager: Callable[..., Any], engine: str, index: int, opts: Options
) -> Callable[..., Any]:
    broken: list[BaseException] = []
    strict = opts.fallback == "error"

    def run(*args: Any) -> Any:
        if broken:
            return eager(*args)
        try:
            return compiled(*args)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # a native panic (pyo3's PanicException) is a BaseException
            if strict:
                raise
            broken.append(exc)
            warnings.warn(
                f"torchburn engine {engine!r} failed while running a partition "
                f"({type(exc).__name__}: {exc}); this partition runs in eager PyTorch from now on",
                TorchburnFallbackWarning,
                stacklevel=2,
            )
            return eager(*args)

    run.__name__ = run.__qualname__ = f"tb_{engine}_partition_{index}"
    run.torchburn_compiled = compiled  # type: ignore[attr-defined]
    return run


_warned: set[str] = set()
MAX_FALLBACK_WARNINGS = 20


def _record_fallbacks(
    gm: torch.fx.GraphModule,
    report: GraphReport,
    reasons: dict[str, list[str]],
    default: str,
    engines: list[Engine] = (),  # type: ignore[assignment]
    specialise: bool = True,
) -> None:
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if str(node.target) in SIZE_OPS:
            continue
        why = reasons.get(node.name)
        if not why and engines:
            # The partitioner may not have asked about this node (it was never a candidate):
            # ask each engine now so the user sees a real reason.
            support = _EngineSupport(engines[0], {}, {}, specialise)
            why = []
            for engine in engines:
                support.engine, support.memo = engine, {}
                support.reasons = {}
                if not support.is_node_supported(None, node):
                    why.extend(support.reasons.get(node.name, []))
        report.fallbacks.append((op_name(node.target), "; ".join(why or []) or default))


def warn_fallbacks(report: GraphReport, opts: Options) -> None:
    if not opts.warn or not report.engines:
        return
    for op, reason in report.fallbacks:
        if op in _warned or not is_compute(op):
            continue
        if len(_warned) >= MAX_FALLBACK_WARNINGS:
            return
        _warned.add(op)
        suffix = " (further fallback warnings are suppressed)" if len(_warned) == MAX_FALLBACK_WARNINGS else ""
        warnings.warn(
            f"torchburn: {op} runs in eager PyTorch ({reason}){suffix}",
            TorchburnFallbackWarning,
            stacklevel=3,
        )


def make_record(report: GraphReport) -> telemetry.GraphRecord:
    native: Counter[str] = Counter()
    delegated: Counter[str] = Counter()
    for p in report.partitions:
        # a specialised partition counts each call itself, as native or fallback by its shapes,
        # and so does a measured one (a routing.Route), as native or routed by the path each call took
        if p.ran and p.shapes is None and (p.route is None or not p.route.measured):
            for op in p.ops:
                if op != GETITEM:
                    (delegated if op in p.delegated else native)[f"{p.engine}:{op}"] += 1
    fallback: Counter[str] = Counter(op for op, _ in report.fallbacks)
    for p in report.partitions:
        if p.status.startswith("compile failed"):
            fallback.update(op for op in p.ops if op != GETITEM)
    return telemetry.new_record(native, fallback, delegated)


__all__ = ["GraphReport", "PartitionReport", "Plan", "compile_graph", "make_record", "warn_fallbacks"]
