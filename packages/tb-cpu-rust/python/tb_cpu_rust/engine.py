"""The ``native_cpu`` engine: checks nodes against the op table and compiles a whole partition
into one prepared Rust executor. Other engines reach the same programs and the eager unary
kernels through tb-core's interface (``prepare``, ``eager_kernel``; ``torchburn.interop``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torchburn
from torchburn.nodeinfo import NodeInfo
from torchburn.plan import GETITEM, Plan

if TYPE_CHECKING:
    import torch

    from torchburn.interop import EagerKernel, PreparedProgram


class NativeCpuEngine(torchburn.Engine):
    name: ClassVar[str] = "native_cpu"
    device: ClassVar[str] = "cpu"
    priority: ClassVar[int] = 30
    distribution: ClassVar[str | None] = "tb-cpu-rust"

    def is_available(self) -> torchburn.Availability:
        try:
            from tb_cpu_rust import _native  # noqa: F401
        except ImportError as exc:  # a wheel built for another platform, say
            return torchburn.Availability(False, f"native module failed to load: {exc}")
        return torchburn.Availability(True)

    def version(self) -> str:
        # the step schema is part of what a cached plan was lowered for (tb_cpu_rust.lowering)
        try:
            from tb_cpu_rust import _native
        except ImportError:
            return super().version()
        return f"{super().version()}+steps{_native.STEP_SCHEMA_VERSION}"

    def describe(self) -> dict[str, Any]:
        from tb_cpu_rust import _native

        return {"isa": _native.isa(), "threads": _native.num_threads(), "gemm": _native.gemm_backend()}

    def kernels(self) -> dict[str, Any]:
        from tb_cpu_rust.ops_table import SUPPORTED

        return {op: None for op in sorted(SUPPORTED)}

    def covered_ops(self) -> set[str]:
        from tb_cpu_rust.ops_table import SUPPORTED

        return set(SUPPORTED)

    def check(self, node: NodeInfo) -> str | None:
        if node.op == GETITEM:
            return None
        from tb_cpu_rust.ops_table import check

        return check(node)

    def compile(self, plan: Plan) -> Callable[..., Any]:
        from tb_cpu_rust.program import NativeProgram

        return NativeProgram(plan)

    def runs_registered_kernels(self) -> bool:
        # a partition is one Rust executor: there is no place for a Python kernel in it
        return False

    def prepare(self, plan: Plan) -> PreparedProgram | None:
        """The plan lowered and prepared as ``compile`` does it, runnable into the caller's outputs.

        None when the plan has a node this engine does not take, or the lowering refuses it."""
        from torchburn.interop import preparable
        from torchburn.nodeinfo import NodeInfo

        if preparable(plan) is not None:
            return None
        for node in plan.nodes:
            if self.check(NodeInfo.of_plan_node(plan, node)) is not None:
                return None
        from tb_cpu_rust.program import PreparedNativeProgram

        try:
            return PreparedNativeProgram(plan)
        except (ValueError, NotImplementedError, KeyError, TypeError):  # the lowering's refusals
            return None

    def eager_kernel(self, op: str, dtype: torch.dtype) -> EagerKernel | None:
        import torch

        if dtype is not torch.float32:
            return None
        from tb_cpu_rust.eager import unary_kernel

        return unary_kernel(op)

    def cache_tag(self) -> str:
        # the ISA the kernels were chosen for is part of what a cached spec was lowered for, and
        # so is torch's CPU capability (the lowering matches eager's kernels of that capability:
        # `lowering.attention.eager_nan_row_masked`)
        import torch

        try:
            from tb_cpu_rust import _native
        except ImportError:
            return self.version()
        return f"{self.version()}+{_native.isa()}+{torch.backends.cpu.get_cpu_capability()}"

    def serialize(self, compiled: Callable[..., Any], plan: Plan) -> bytes | None:
        """The lowered executor spec (JSON text) and what the program binds from it (buffers,
        values, outputs): a later process makes the executor from it without lowering again."""
        lowered = getattr(compiled, "lowered", None)
        if lowered is None:
            return None
        kept = {k: lowered[k] for k in _LOWERED_KEYS}
        return json.dumps({"format": _PAYLOAD, "lowered": kept}, allow_nan=False).encode()

    def deserialize(self, payload: bytes, plan: Plan) -> Callable[..., Any] | None:
        data = json.loads(payload)
        if not isinstance(data, dict) or data.get("format") != _PAYLOAD:
            return None
        lowered = data["lowered"]
        if not isinstance(lowered, dict) or set(lowered) != set(_LOWERED_KEYS):
            return None
        from tb_cpu_rust.program import NativeProgram

        # the executor parses and validates the spec (its schema version included) as for a fresh one
        return NativeProgram(plan, lowered)


#: the cache payload's format, and the parts of ``lower(plan)`` a NativeProgram is made from
_PAYLOAD = "tb-cpu-rust/lowered-1"
_LOWERED_KEYS = ("json", "buffers", "values", "n_inputs", "outputs", "direct")
