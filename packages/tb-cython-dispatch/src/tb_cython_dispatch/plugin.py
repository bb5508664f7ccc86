"""Entry point of the ``cython_dispatch`` engine. Imports cheaply: torch only inside methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torchburn

PLUGIN_API_VERSION = 1

_PAYLOAD = b"cython-dispatch-plan/1"


class CythonDispatchEngine(torchburn.Engine):
    """Runs partitions as a typed Cython loop over pre-resolved callables.

    It takes every ATen op with static shapes: it is a dispatch engine, so a node's kernel is the
    op's own ATen entry (PyTorch's kernel: "delegated" in telemetry), resolved once at compile
    time, with its argument slots pre-bound — unless a plugin registered a kernel for
    ``cython_dispatch`` and that op (``tb_register_kernels``) whose checker accepts the node.
    """

    name = "cython_dispatch"
    device = "cpu"
    priority = 10
    distribution = "tb-cython-dispatch"

    def is_available(self) -> torchburn.Availability:
        return torchburn.Availability(True)

    def describe(self) -> dict[str, Any]:
        from tb_cython_dispatch import _impl

        return {"implementation": _impl.implementation(), "compiled_extension": _impl.COMPILED_AVAILABLE}

    def covered_ops(self) -> set[str]:
        # Every ATen op with static shapes: the kernel is the op's own ATen entry.
        from torchburn.catalog import CATALOG

        return set(CATALOG)

    def native_ops(self) -> set[str]:
        # only what plugins registered runs on a kernel other than PyTorch's own
        return set(self.kernels())

    def runs_registered_kernels(self) -> bool:
        return True

    def check(self, node: torchburn.NodeInfo) -> str | None:
        from tb_cython_dispatch.engine import check_node

        return check_node(node)

    def compile(self, plan: torchburn.Plan) -> Callable[..., Any]:
        from tb_cython_dispatch.engine import compile_plan

        return compile_plan(plan, kernels=self.kernels())

    def delegated_ops(self, plan: torchburn.Plan) -> set[str]:
        from tb_cython_dispatch.engine import delegated_ops

        return delegated_ops(plan, self.kernels())

    def serialize(self, compiled: Callable[..., Any], plan: torchburn.Plan) -> bytes | None:
        return _PAYLOAD

    def deserialize(self, payload: bytes, plan: torchburn.Plan) -> Callable[..., Any] | None:
        return self.compile(plan) if payload == _PAYLOAD else None


@torchburn.hookimpl
def tb_register_engines() -> list[Any]:
    return [CythonDispatchEngine]
