"""Entry-point module. It imports cheaply: torch is only imported inside the hooks."""

from __future__ import annotations

from typing import Any

import torchburn

PLUGIN_API_VERSION = 1


class ExampleEngine(torchburn.Engine):
    name = "example"
    device = "cpu"
    priority = 0
    distribution = "tb-example-engine"


@torchburn.hookimpl
def tb_register_engines() -> list[Any]:
    return [ExampleEngine]


@torchburn.hookimpl
def tb_register_kernels(registry: torchburn.KernelRegistry) -> None:
    from tb_example_engine.kernels import KERNELS

    checker = torchburn.accepts((_float32(),))
    for op, fn in KERNELS.items():
        registry.register("example", op, fn, checker, source="tb-example-engine")


def _float32() -> Any:
    import torch

    return torch.float32
