"""tb_register_kernels reaches cython_dispatch: a kernel a plugin registers for it runs the nodes its
checker accepts (and counts as native); every other node keeps PyTorch's ATen entry (delegated)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

import torchburn

CALLS: list[tuple[int, ...]] = []


# a kernel pack installed beside this package (the example engine adds a gelu) would change the counts
pytestmark = pytest.mark.usefixtures("only_this_package")


def _relu_kernel(x: torch.Tensor) -> torch.Tensor:
    CALLS.append(tuple(x.shape))
    return torch.clamp_min(x, 0.0)


class ReluPack:
    @torchburn.hookimpl
    def tb_register_kernels(self, registry: torchburn.KernelRegistry) -> None:
        registry.register(
            "cython_dispatch", "aten.relu.default", _relu_kernel, torchburn.accepts((torch.float32,)), source="pack"
        )


@pytest.fixture
def relu_pack(impl: ModuleType) -> Iterator[None]:
    CALLS.clear()
    torchburn.register_plugin(ReluPack(), "relu-pack")
    try:
        yield
    finally:
        torchburn.unregister_plugin("relu-pack")


def _run(fn: Any, *args: torch.Tensor) -> tuple[Any, torchburn.Explanation]:
    explanation = torchburn.explain(fn, *args, options={"engine": "cython_dispatch", "cache": False})
    return explanation.output, explanation


def _f(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).relu() + 1


def test_registered_kernel_runs_and_counts_as_native(relu_pack: None) -> None:
    engine = torchburn.plugins.engines()["cython_dispatch"]
    assert engine.runs_registered_kernels() and engine.native_ops() == {"aten.relu.default"}
    x = torch.randn(4, 5)
    out, explanation = _run(_f, x)
    torch.testing.assert_close(out, _f(x))
    assert CALLS == [(4, 5)]
    assert explanation.native_ops == {"aten.relu.default": 1}
    assert explanation.delegated_ops["aten.mul.Tensor"] == 1 and explanation.delegated_ops["aten.add.Tensor"] == 1
    torchburn.plugins.reload()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torchburn.plugins.state()
    assert not [w for w in caught if "not run registered kernels" in str(w.message)]
    assert torchburn.plugins.state().unused_kernels == []


def test_a_node_the_checker_refuses_keeps_the_aten_entry(relu_pack: None) -> None:
    x = torch.randn(4, 5, dtype=torch.float64)
    out, explanation = _run(_f, x)
    assert torch.equal(out, _f(x))
    assert CALLS == []
    assert not explanation.native_ops and explanation.delegated_ops["aten.relu.default"] == 1


def test_without_the_pack_relu_is_delegated(impl: ModuleType) -> None:
    CALLS.clear()
    x = torch.randn(3, 3)
    out, explanation = _run(_f, x)
    assert torch.equal(out, _f(x)) and CALLS == []
    assert not explanation.native_ops and explanation.delegated_ops["aten.relu.default"] == 1
