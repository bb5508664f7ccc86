"""The example engine proves the plugin API from outside tb-core."""

from __future__ import annotations

import pytest
import torch

import torchburn
from tb_example_engine.kernels import KERNELS
from torchburn.testing import EngineConformance
from torchburn.testing.models import MODELS, train_losses


def test_engine_is_found_through_its_entry_point() -> None:
    assert "example" in torchburn.plugins.engines()
    assert torchburn.active_engines() == ["example"]


class TestExampleConformance(EngineConformance):
    engine = "example"
    native_ops = frozenset(KERNELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_set_runs_its_ops_native(name: str) -> None:
    if name == "tiny_causal_lm":
        pytest.importorskip("transformers")
    model, args = MODELS[name]()
    torchburn.reset_stats()
    with torch.no_grad():
        expected = model(*args)
        actual = torch.compile(model, backend="torchburn", options={"warn": False})(*args)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    cov = torchburn.op_coverage()
    if name == "readme_mlp":
        assert set(cov["native"]) >= {"aten.addmm.default", "aten.relu.default"}
        assert not cov["fallback"]
    else:
        assert cov["native"], cov


def test_training_with_adam_matches_eager() -> None:
    torch._dynamo.reset()
    torchburn.reset_stats()
    eager = train_losses(None)
    compiled = train_losses(lambda m: torch.compile(m, backend="torchburn", options={"warn": False}))
    assert max(abs(a - b) for a, b in zip(eager, compiled)) <= 1e-5
    assert "aten.addmm.default" in torchburn.op_coverage()["native"]


def test_the_kernel_pack_part_registers_for_another_engine() -> None:
    """tb_register_kernels adds the example's gelu to cython_dispatch's table (a kernel pack).

    That engine running it is shown in integration_tests/test_cython_dispatch_kernel_pack.py, where
    cython_dispatch is installed; here, with only tb-core, the entry waits unused, with no warning."""
    import warnings

    from tb_example_engine import plugin
    from tb_example_engine.kernels import KERNEL_PACK

    registry = torchburn.KernelRegistry()
    plugin.tb_register_kernels(registry=registry)
    kernel = registry.lookup("cython_dispatch", "aten.gelu.default")
    assert kernel is not None and kernel.fn is KERNEL_PACK["cython_dispatch"]["aten.gelu.default"]
    assert kernel.source == "tb-example-engine" and kernel.checker is not None
    assert set(registry.table("example")) == set(KERNELS)
    x = torch.randn(5)
    torch.testing.assert_close(kernel.fn(x), torch.nn.functional.gelu(x))
    torchburn.plugins.reload()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = torchburn.plugins.state()
    assert "cython_dispatch" not in state.engines and state.unused_kernels == []
    assert not [w for w in caught if "registered kernels" in str(w.message)]
