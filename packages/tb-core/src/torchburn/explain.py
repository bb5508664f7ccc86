"""``torchburn.explain``: which engine runs each partition, and why every fallback op falls back.

A partition's ops that its engine hands to PyTorch's own kernels are listed as delegated
(``Engine.delegated_ops``): they ran inside an engine, but on no kernel of its own. A partition
with symbolic sizes (dynamic shapes) says how many concrete shapes it was specialised to, how many
its cache holds, and why any shape ran in eager PyTorch (``torchburn.specialise``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

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
    def fully_native(self) -> bool:
        """Every node ran on an engine's own kernel: no eager fallback and nothing delegated."""
        return bool(self.graphs) and all(not g.fallbacks and not g.delegated_ops() for g in self.graphs)

    def __str__(self) -> str:
        lines = []
        for i, g in enumerate(self.graphs):
            engines = ", ".join(g.engines) or "none (eager only)"
            lines.append(f"graph {i} ({g.kind}); engines in force: {engines}")
            for j, p in enumerate(g.partitions):
                ops = Counter(op for op in p.ops if op != "getitem")
                listing = ", ".join(f"{op}×{n}" if n > 1 else op for op, n in sorted(ops.items()))
                status = p.shapes.describe() if p.shapes is not None else p.status
                lines.append(f"  partition {j} on {p.engine} [{status}]: {listing}")
                handed = sorted(op for op in ops if op in p.delegated)
                if handed and p.ran:
                    lines.append(f"    delegated to PyTorch's kernels by {p.engine}: {', '.join(handed)}")
                if p.shapes is not None:
                    for shape, reason in p.shapes.eager_reasons.items():
                        lines.append(f"    eager for sizes {shape}: {reason}")
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
    **example_kwargs: Any,
) -> Explanation:
    """Compile ``fn`` with the torchburn backend, run it once, and report how it was split.

    ``dynamic`` is ``torch.compile``'s: True traces the sizes as symbols from the first call, so the
    report shows the partitions specialised per shape (``torchburn.specialise``)."""
    from torchburn.backend import torchburn_backend

    sink: list[GraphReport] = []
    opts = {**(options or {}), "report_sink": sink, "warn": False}

    def backend(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        return torchburn_backend(gm, inputs, options=opts)

    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    output = compiled(*example_args, **example_kwargs)
    return Explanation(sink, output)
