"""``torchburn.explain``: which engine runs each partition, and why every fallback op falls back.

A partition's ops that its engine hands to PyTorch's own kernels are listed as delegated
(``Engine.delegated_ops``): they ran inside an engine, but on no kernel of its own. A partition
with symbolic sizes (dynamic shapes) says how many concrete shapes it was specialised to, how many
its cache holds, and why any shape ran in eager PyTorch (``torchburn.specialise``). Each partition
says how it is routed (``torchburn.routing``): the engine's and eager's median times and the
decision, per thread count (per shape for a specialised partition), or why it is not measured.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from torchburn import low_precision_route, routing
from torchburn.low_precision_route import SETTLE_CALLS
from torchburn.partition import GraphReport


@dataclass
class Explanation:
    graphs: list[GraphReport] = field(default_factory=list)
    output: Any = None

    @property
    def fallback_reasons(self) -> dict[str, set[str]]:
        reasons: dict[str, set[str]] = {}
        for g in self.graphs:
            for op, reason in g.fallbacks:
                reasons.setdefault(op, set()).add(reason)
        return reasons

    @property
    def native_ops(self) -> Counter[str]:
        """Nodes engines ran with their own kernels."""
        c: Counter[str] = Counter()
        for g in self.graphs:
            c.update(g.native_ops())
        return c

    @property
    def delegated_ops(self) -> Counter[str]:
        """Nodes engines took but ran with PyTorch's own kernels."""
        c: Counter[str] = Counter()
        for g in self.graphs:
            c.update(g.delegated_ops())
        return c

    @property
    def routed_ops(self) -> Counter[str]:
        """Nodes of compiled partitions that run in eager PyTorch because it measured faster."""
        c: Counter[str] = Counter()
        for g in self.graphs:
            c.update(g.routed_ops())
        return c

    @property
    def fully_native(self) -> bool:
        """Every node ran on an engine's own kernel: no eager fallback, nothing delegated, nothing
        routed to eager PyTorch by measurement."""
        return bool(self.graphs) and all(
            not g.fallbacks and not g.delegated_ops() and not g.routed_ops() for g in self.graphs
        )

    def __str__(self) -> str:
        lines = []
        for i, g in enumerate(self.graphs):
            engines = ", ".join(g.engines) or "none (eager only)"
            lines.append(f"graph {i} ({g.kind}); engines in force: {engines}")
            if g.low_precision is not None:
                what = (
                    "bfloat16/float16 graph, widened or as traced"
                    if g.low_precision.widened
                    else "whole graph, compiled or as Dynamo traced it (eager PyTorch)"
                )
                lines.append(f"  {what} by measurement: {g.low_precision.describe()}")
            for j, p in enumerate(g.partitions):
                ops = Counter(op for op in p.ops if op != "getitem")
                listing = ", ".join(f"{op}×{n}" if n > 1 else op for op, n in sorted(ops.items()))
                status = p.shapes.describe() if p.shapes is not None else p.status
                lines.append(f"  partition {j} on {p.engine} [{status}]: {listing}")
                handed = sorted(op for op in ops if op in p.delegated)
                if handed and p.ran:
                    lines.append(f"    delegated to PyTorch's kernels by {p.engine}: {', '.join(handed)}")
                if p.route is not None:
                    lines.append(f"    routing: {p.route.describe()}")
                if p.shapes is not None:
                    for shape, reason in p.shapes.eager_reasons.items():
                        lines.append(f"    eager for sizes {shape}: {reason}")
                    for shape, route in p.shapes.routes.items():
                        lines.append(f"    routing for sizes {shape}: {route.describe()}")
            if g.fallbacks:
                lines.append("  eager fallback:")
                for (op, reason), n in sorted(Counter(g.fallbacks).items()):
                    lines.append(f"    {op}{f' ×{n}' if n > 1 else ''}: {reason}")
            else:
                lines.append("  no eager fallback")
        return "\n".join(lines) if lines else "no graph was compiled"


def explain(
    fn: Any,
    *example_args: Any,
    options: dict[str, Any] | None = None,
    dynamic: bool | None = False,
    measure: bool = True,
    **example_kwargs: Any,
) -> Explanation:
    """Compile ``fn`` with the torchburn backend, run it, and report how it was split.

    ``dynamic`` is ``torch.compile``'s: True traces the sizes as symbols from the first call, so the
    report shows the partitions specialised per shape (``torchburn.specialise``).

    ``measure``: while a partition is still being timed against eager (``torchburn.routing``),
    ``fn`` is called again with the same arguments (at most ``routing.MAX_DECISION_CALLS`` calls in all), so
    the report shows each partition's times and decision; never when a graph writes into its
    inputs or draws random numbers (a second call would not be the same call); a bfloat16 / float16
    graph may take up to ``low_precision_route.SETTLE_CALLS`` more (``torchburn.low_precision_route``). The output is the
    first call's. False: one call, and the report says "measuring"."""
    from torchburn.backend import torchburn_backend

    sink: list[GraphReport] = []
    opts = {**(options or {}), "report_sink": sink, "warn": False}

    def backend(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        return torchburn_backend(gm, inputs, options=opts)

    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    output = compiled(*example_args, **example_kwargs)
    if measure and all(g.repeatable for g in sink):
        for _ in range(SETTLE_CALLS + max(routing.MAX_DECISION_CALLS, low_precision_route.MAX_DECISION_CALLS) - 1):
            if not any(g.pending_routes() for g in sink):
                break
            compiled(*example_args, **example_kwargs)
    return Explanation(sink, output)
