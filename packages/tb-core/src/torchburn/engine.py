"""The Engine contract every engine plugin implements.

An engine says, node by node, what it accepts (``check``), and turns a partition's ``Plan``
into a callable (``compile``). The default implementations work from the engine's table in the
kernel registry, so a small engine only registers kernels; a native engine overrides
``compile`` to hand the whole plan to its executor in one call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar

from torchburn._version import PLUGIN_API_VERSION
from torchburn.nodeinfo import NodeInfo
from torchburn.plan import GETITEM, Plan
from torchburn.program import KernelProgram


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class Engine:
    #: Engine name, entry-point name and key in the kernel registry.
    name: ClassVar[str] = ""
    #: "cpu" or "gpu": what ``TORCHBURN_DEVICE`` selects on.
    device: ClassVar[str] = "cpu"
    #: The plugin API this engine was built for; tb-core refuses others.
    plugin_api_version: ClassVar[int] = PLUGIN_API_VERSION
    #: Higher is preferred when the user names no engine.
    priority: ClassVar[int] = 0
    #: Distribution that ships the engine (for its version); defaults to the module's top package.
    distribution: ClassVar[str | None] = None

    def version(self) -> str:
        dist = self.distribution or type(self).__module__.split(".")[0]
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "0+unknown"

    def is_available(self) -> Availability:
        return Availability(True)

    def describe(self) -> dict[str, Any]:
        """Extra facts for ``torchburn engines`` / ``doctor`` (adapter name, ISA, threads...)."""
        return {}

    # -- capability ----------------------------------------------------------------------
    def kernels(self) -> dict[str, Any]:
        from torchburn.plugins import registry

        return registry().table(self.name)

    def covered_ops(self) -> set[str]:
        """Op overloads this engine has kernels for (some dtypes/layouts may still be refused)."""
        return set(self.kernels())

    def check(self, node: NodeInfo) -> str | None:
        """None if this engine takes ``node``, else the reason it does not."""
        if node.op == GETITEM:
            return None
        kernel = self.kernels().get(node.op)
        if kernel is None:
            return "no kernel"
        return kernel.checker(node) if kernel.checker is not None else None

    def supports(self, node: NodeInfo) -> bool:
        return self.check(node) is None

    # -- compilation ---------------------------------------------------------------------
    def compile(self, plan: Plan) -> Callable[..., Any]:
        """Turn a plan into a callable taking the plan's inputs and returning its outputs."""
        table = self.kernels()
        return KernelProgram(plan, {op: k.fn for op, k in table.items()})

    def serialize(self, compiled: Callable[..., Any], plan: Plan) -> bytes | None:
        """Bytes for the on-disk cache, or None if this engine's plans are not persisted."""
        if isinstance(compiled, KernelProgram):
            return b"kernel-program"
        return None

    def deserialize(self, payload: bytes, plan: Plan) -> Callable[..., Any] | None:
        """Rebuild a compiled partition from ``serialize``'s bytes; None if they are not ours."""
        if payload == b"kernel-program":
            return self.compile(plan)
        return None

    def __repr__(self) -> str:
        return f"<Engine {self.name} ({self.device})>"
