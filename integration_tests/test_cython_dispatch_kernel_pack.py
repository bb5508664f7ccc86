"""A kernel pack from outside reaches a built-in engine: the example engine's tb_register_kernels
adds its gelu to cython_dispatch's table, and cython_dispatch runs it (counted native).

The example engine is a template that the integration session does not install, so its plugin
module is loaded from the source tree and registered in-process, as its entry point would be.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import torchburn

EXAMPLE_SRC = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tb-example-engine" / "src"


@pytest.fixture
def example_pack(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    from tb_example_engine import kernels, plugin

    calls: list[tuple[int, ...]] = []
    original = kernels.KERNEL_PACK["cython_dispatch"]["aten.gelu.default"]

    def counting(x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return original(x, **kwargs)

    monkeypatch.setitem(kernels.KERNEL_PACK["cython_dispatch"], "aten.gelu.default", counting)
    registered_here = "example" not in torchburn.plugins.engines()
    if registered_here:  # not installed: register the module as its entry point would
        torchburn.register_plugin(plugin, "tb-example-engine-from-source")
    else:
        torchburn.plugins.reload()
    try:
        yield calls
    finally:
        if registered_here:
            torchburn.unregister_plugin("tb-example-engine-from-source")
        torchburn.plugins.reload()


def _model(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x * 3.0) - 1.0


def test_cython_dispatch_runs_the_example_gelu(example_pack: list[tuple[int, ...]]) -> None:
    engine = torchburn.plugins.engines()["cython_dispatch"]
    assert "aten.gelu.default" in engine.native_ops()
    x = torch.randn(4, 6)
    explanation = torchburn.explain(_model, x, options={"engine": "cython_dispatch", "cache": False})
    torch.testing.assert_close(explanation.output, _model(x))
    assert example_pack == [(4, 6)]
    assert explanation.native_ops == {"aten.gelu.default": 1}
    assert explanation.delegated_ops["aten.mul.Tensor"] == 1


def test_float64_nodes_keep_the_aten_entry(example_pack: list[tuple[int, ...]]) -> None:
    x = torch.randn(3, dtype=torch.float64)
    explanation = torchburn.explain(_model, x, options={"engine": "cython_dispatch", "cache": False})
    assert torch.equal(explanation.output, _model(x))
    assert example_pack == [] and explanation.delegated_ops["aten.gelu.default"] == 1
