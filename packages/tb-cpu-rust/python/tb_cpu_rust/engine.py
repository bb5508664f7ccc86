"""The ``native_cpu`` engine: checks nodes against the op table and compiles a whole partition
into one prepared Rust executor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torchburn
from torchburn.nodeinfo import NodeInfo
from torchburn.plan import GETITEM, Plan


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

    def serialize(self, compiled: Callable[..., Any], plan: Plan) -> bytes | None:
        # The executor is rebuilt from the plan (cheap); the bytes only mark it as ours.
        return b"tb-cpu-rust/1"

    def deserialize(self, payload: bytes, plan: Plan) -> Callable[..., Any] | None:
        return self.compile(plan) if payload == b"tb-cpu-rust/1" else None
