"""The Engine contract every engine plugin implements.

An engine says, node by node, what it accepts (``check``), and turns a partition's ``Plan``
into a callable (``compile``). The default implementations work from the engine's table in the
kernel registry, so a small engine only registers kernels; a native engine overrides
``compile`` to hand the whole plan to its executor in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar

from torchburn._version import PLUGIN_API_VERSION
from torchburn.nodeinfo import NodeInfo
from torchburn.plan import GETITEM, Plan
from torchburn.program import KernelProgram

if TYPE_CHECKING:
    import torch

    from torchburn.interop import EagerKernel, PreparedProgram


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

    def native_ops(self) -> set[str]:
        """The ops of ``covered_ops()`` this engine runs on kernels of its own.

        The rest it takes by handing them to PyTorch's kernels (``torchburn ops`` shows them as
        delegated; ``delegated_ops`` says which nodes of a plan). Default: all of them.
        """
        return self.covered_ops()

    def runs_registered_kernels(self) -> bool:
        """True when kernels added to this engine's registry table (``tb_register_kernels``) run.

        The default ``check`` / ``compile`` read the table, so an engine that keeps them does; an
        engine that overrides either and still consults the table says so by overriding this.
        """
        cls = type(self)
        return cls.check is Engine.check and cls.compile is Engine.compile

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

    def delegated_ops(self, plan: Plan) -> Collection[str]:
        """Ops of ``plan`` this engine's compiled program hands to PyTorch's own kernels.

        Telemetry reports their nodes as "delegated", not "native" (``torchburn.op_coverage``).
        An engine that runs its own kernel for every node it takes returns nothing (the default).
        """
        return ()

    # -- use by other engines (torchburn.interop) ----------------------------------------
    def prepare(self, plan: Plan) -> PreparedProgram | None:
        """``plan`` compiled as ``compile`` does it, as a program that runs into the caller's outputs.

        None: this engine offers no such program for this plan (the default). See
        ``torchburn.interop.PreparedProgram`` for what the program checks and promises.
        """
        return None

    def eager_kernel(self, op: str, dtype: torch.dtype) -> EagerKernel | None:
        """This engine's kernel for one eager call of ``op`` ("aten.sin.default") on ``dtype``.

        The function takes the op's tensor arguments positionally and returns a new tensor equal
        to the op's result for contiguous, strided tensors of ``dtype`` on this engine's device;
        for any other input it raises ``ValueError`` or ``TypeError`` and touches no memory.
        None: not offered (the default).
        """
        return None

    def cache_tag(self) -> str:
        """What the persistent compile cache keys this engine's entries by: anything that changes
        what ``compile`` makes of a plan (version, a native schema version, the ISA it targets).
        tb-core adds a fingerprint of the engine's installed files. Default: ``version()``."""
        return self.version()

    # -- the persistent compile cache (optional) ------------------------------------------
    def serialize(self, compiled: Callable[..., Any], plan: Plan) -> bytes | None:
        """Bytes for the on-disk cache, or None if this engine's plans are not persisted.

        Plain data only (JSON, a spec text...): ``deserialize`` must rebuild the program from
        them and ``plan`` without lowering again, and must never unpickle or execute them."""
        if isinstance(compiled, KernelProgram):
            return b"kernel-program"
        return None

    def deserialize(self, payload: bytes, plan: Plan) -> Callable[..., Any] | None:
        """Rebuild a compiled partition from ``serialize``'s bytes; None if they are not ours.

        tb-core has already checked the entry's checksum and that it was written by this engine
        with the same ``version()`` and ``cache_tag()``; an exception here counts as a rejected
        entry, and the partition is compiled again."""
        if payload == b"kernel-program":
            return self.compile(plan)
        return None

    def __repr__(self) -> str:
        return f"<Engine {self.name} ({self.device})>"
