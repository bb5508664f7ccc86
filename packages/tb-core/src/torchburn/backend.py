"""The ``"torchburn"`` torch.compile backend: Dynamo graph -> AOTAutograd -> partitions."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
import torch.fx

from torchburn import autocast_state, direct_inference, low_precision_route
from torchburn.cache import graph_cache, traced_graph_key
from torchburn.catalog import kept_op_names
from torchburn.low_precision import low_precision_ops, taken_as_is, widen_low_precision
from torchburn.options import Options, TorchburnFallbackWarning, select_engines
from torchburn.partition import compile_graph, make_record, warn_fallbacks

BACKEND_NAME = "torchburn"


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """Core ATen decompositions, minus the ops engines want to see whole (see catalog.KEPT_OPS)."""
    from torch._decomp import core_aten_decompositions

    from torchburn.decompositions import EXTRA_DECOMPOSITIONS

    table = dict(core_aten_decompositions())
    kept = set(kept_op_names())
    table = {op: fn for op, fn in table.items() if str(op) not in kept}
    table.update(EXTRA_DECOMPOSITIONS)
    return table


def torchburn_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None, **kwargs: Any
) -> Callable[..., Any]:
    """``torch.compile(model, backend="torchburn", options={...})``.

    Options: ``engine`` (name or priority list), ``min_partition_size``, ``min_partition_work``, ``cache``,
    ``fallback`` ("eager" or "error"), ``warn``, ``routing`` ("measure" or "off"). See
    ``torchburn.options.Options``.
    """
    # the autocast state Dynamo compiled this graph under (and guards on): decompositions of
    # fused ops apply its casts, direct inference runs the traced graph with autocast off
    with autocast_state.traced_under(autocast_state.current()):
        return _compile(gm, example_inputs, Options.from_user({**(options or {}), **kwargs}))


def _compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: Options) -> Callable[..., Any]:
    from torch._dynamo.backends.common import aot_autograd

    engines = select_engines(opts)
    opts.routing_mode()  # a bad TORCHBURN_ROUTING fails here, not as a partitioning fallback later

    def runner(
        graph: torch.fx.GraphModule, kind: str, boxed: bool, source: torch.fx.GraphModule | None = None
    ) -> Callable[..., Any]:
        """The partitioned graph as the callable AOTAutograd (boxed: one list argument) or Dynamo
        (direct inference: the arguments) calls, counted in telemetry. ``source``: the Dynamo graph
        ``graph`` was traced from, taking the same arguments (direct inference)."""
        traced = None
        widened = False
        measurable = low_precision_route.not_measured_reason(graph, kind, opts.routing_mode()) is None
        low = bool(low_precision_ops(graph.graph.nodes))
        if opts.widen_low_precision() and low:
            if measurable:
                traced = low_precision_route.copy_graph(graph)
            graph = widen_low_precision(graph, keep=taken_as_is(engines))
            widened = True
        elif source is not None and measurable and not low:
            # direct inference: the compiled graph against Dynamo's own graph in eager PyTorch,
            # which can beat the ATen graph its partitions' routing falls back to (``linear``
            # where the ATen graph has ``permute`` and ``addmm``; a module's fused fast path)
            traced = low_precision_route.copy_graph(graph)
        runnable, report = compile_graph(graph, engines, opts, kind)
        warn_fallbacks(report, opts)
        if opts.report_sink is not None:
            opts.report_sink.append(report)
        record = make_record(report)
        forward = runnable.forward if isinstance(runnable, torch.nn.Module) else runnable
        if source is not None and torch._C._is_any_autocast_enabled():
            # the ATen graph holds autocast's casts already: run it with autocast off, as
            # AOTAutograd's runtime wrapper does, so its eager ops are not cast a second time
            # (the graph as traced, Dynamo's, stays autocast's input)
            forward = _without_autocast(forward)

        def counted(*args: Any) -> Any:
            record.calls += 1
            return forward(*args)

        call: Callable[..., Any] = counted
        if traced is not None and report.partitions:
            chooser = low_precision_route.LowPrecisionRoute(
                counted,
                traced,
                pending=report.partitions_pending,
                engine=report.partitions[0].engine,
                fallback_ops=record.fallback,
                run_as_traced=source.forward if source is not None else None,
                symbolic=direct_inference.symbolic(traced),
                widened=widened,
                **_stored_decisions(traced, engines, opts),
            )
            report.low_precision = chooser.stats
            call = chooser

        def run_boxed(args: list[Any]) -> Any:
            return call(*args)

        def run_direct(*args: Any) -> Any:
            return call(*args)

        run: Any = run_boxed if boxed else run_direct
        if boxed:
            run._boxed_call = True
        run.torchburn_report = report
        run.torchburn_graph = runnable
        return run  # type: ignore[no-any-return]

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_fn(graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
            return runner(graph, kind, boxed=True)

        return compile_fn

    if opts.direct_inference and direct_inference.eligible(gm, example_inputs):
        traced = _traced(gm, example_inputs, opts, engines)
        if traced is not None:
            return runner(traced, "inference", boxed=False, source=gm)

    try:
        return aot_autograd(  # type: ignore[no-any-return]
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=decomposition_table(),
            keep_inference_input_mutations=True,
        )(gm, example_inputs)
    except Exception as exc:
        if opts.fallback == "error":
            raise
        # AOTAutograd cannot capture every graph (e.g. some data-dependent ops); the Dynamo
        # graph itself is still correct PyTorch.
        warnings.warn(
            f"torchburn could not capture this graph with AOTAutograd ({type(exc).__name__}: {exc}); "
            "it runs in eager PyTorch",
            TorchburnFallbackWarning,
            stacklevel=2,
        )
        return gm.forward


def _without_autocast(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        with torch._C._DisableAutocast():
            return fn(*args)

    return run


def _stored_decisions(traced: torch.fx.GraphModule, engines: Sequence[Any], opts: Options) -> dict[str, Any]:
    """``lookup`` / ``store`` of a LowPrecisionRoute: its decisions in the compile cache, under
    ``low_precision_route.decision_key``, the thread count and, for symbolic sizes, the input sizes;
    none when the cache is off or the graph has no stable key."""
    if not opts.cache:
        return {}
    from torchburn import routing
    from torchburn.cache import engine_tag

    try:
        base = low_precision_route.decision_key(traced, [engine_tag(e) for e in engines])
    except Exception:  # a graph without a stable text: decided in memory only
        return {}
    cache = graph_cache()

    def key_of(where: Hashable) -> str:
        threads, sizes = where if isinstance(where, tuple) else (where, None)
        return routing.route_key(base, repr(sizes), threads)

    def lookup(where: Hashable) -> routing.Decision | None:
        data = cache.load_route(key_of(where))
        try:
            return routing.Decision.from_json(data) if data is not None else None
        except (ValueError, KeyError, TypeError):
            return None

    def store(where: Hashable, decision: routing.Decision) -> None:
        cache.store_route(key_of(where), decision.to_json())

    return {"lookup": lookup, "store": store}


def _traced(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: Options, engines: Sequence[Any]
) -> torch.fx.GraphModule | None:
    """Direct inference's ATen graph of ``gm``: from the persistent compile cache when a former
    process stored it (no decomposition table, no trace), else traced and stored."""
    cache = graph_cache()
    key = traced_graph_key(gm, example_inputs, opts, engines) if cache.disk_dir is not None and opts.cache else None
    if key is not None:
        restored = cache.load_graph(key)
        if restored is not None:
            return restored
    traced = direct_inference.trace(gm, example_inputs, decomposition_table())
    if traced is not None and key is not None:
        cache.store_graph(key, traced)
    return traced


def register() -> None:
    """Register the backend with Dynamo (idempotent)."""
    from torch._dynamo import list_backends, register_backend

    if BACKEND_NAME not in list_backends(exclude_tags=()):
        register_backend(name=BACKEND_NAME)(torchburn_backend)
