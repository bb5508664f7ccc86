from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch

import torchburn
from torchburn import partition, plugins
from torchburn.cache import configure


class ToyEngine(torchburn.Engine):
    """An in-process engine with a small kernel table; records what it was asked to compile."""

    name = "toy"
    priority = 5
    compiled_plans: ClassVar[list[Any]] = []
    fail_compile = False
    fail_run: bool | type[BaseException] = False  # True: RuntimeError; or the exception class to raise

    def compile(self, plan: torchburn.Plan) -> Any:
        if self.fail_compile:
            raise RuntimeError("toy compile failure")
        ToyEngine.compiled_plans.append(plan)
        program = super().compile(plan)
        if not self.fail_run:
            return program

        error = self.fail_run if isinstance(self.fail_run, type) else RuntimeError

        def broken(*args: Any) -> Any:
            raise error("toy run failure")

        return broken


TOY_OPS = {
    "aten.add.Tensor": torch.ops.aten.add.Tensor,
    "aten.mul.Tensor": torch.ops.aten.mul.Tensor,
    "aten.relu.default": torch.ops.aten.relu.default,
    "aten.addmm.default": torch.ops.aten.addmm.default,
    "aten.permute.default": torch.ops.aten.permute.default,
    "aten.sigmoid.default": torch.ops.aten.sigmoid.default,
}


class ToyPlugin:
    @torchburn.hookimpl
    def tb_register_engines(self) -> list[Any]:
        return [ToyEngine]

    @torchburn.hookimpl
    def tb_register_kernels(self, registry: torchburn.KernelRegistry) -> None:
        for op, fn in TOY_OPS.items():
            registry.register("toy", op, fn, torchburn.accepts((torch.float32, torch.float64)))


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[None]:
    """Each test sees no installed plugins unless it adds them, and a fresh cache and Dynamo."""
    monkeypatch.setenv("TORCHBURN_LOAD_PLUGINS", "__none__")
    for var in ("TORCHBURN_ENGINE", "TORCHBURN_DEVICE", "TORCHBURN_DISABLED_PLUGINS", "TORCHBURN_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    plugins._extra.clear()
    plugins.reload()
    configure(maxsize=512, disk_dir=None)
    torch._dynamo.reset()
    torchburn.reset_stats()
    ToyEngine.compiled_plans = []
    partition._warned.clear()
    ToyEngine.fail_compile = ToyEngine.fail_run = False
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        yield
    plugins._extra.clear()
    plugins.reload()


@pytest.fixture
def toy() -> type[ToyEngine]:
    torchburn.register_plugin(ToyPlugin(), "toy-plugin")
    return ToyEngine
