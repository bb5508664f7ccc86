"""wgpu engine behaviour: adapter facts, one submission per partition call, parameter residency,
the tb-core model set natively on wgpu, and clean errors on device loss and oversized buffers."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import tb_wgpu
import torchburn
from tb_wgpu import device as gpu
from torchburn.testing.models import MODELS


def _compile(model: nn.Module, **options: object) -> object:
    torch._dynamo.reset()
    return torch.compile(model, backend="torchburn", options={"engine": "wgpu", "warn": False, **options})


def test_engine_is_registered_and_describes_its_adapter() -> None:
    engine = torchburn.plugins.engines()["wgpu"]
    assert engine.device == "gpu"
    available = engine.is_available()
    assert available, available.reason
    facts = engine.describe()
    assert facts["adapter"] and facts["backend"]
    assert isinstance(facts["shader-f16"], bool)
    assert facts["max_storage_buffer_binding_size"] > 0
    ctx = gpu.context()
    assert engine.priority == (5 if ctx.is_software else 40)


def test_unknown_backend_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_WGPU_BACKEND", "glide")
    with pytest.raises(gpu.WgpuUnavailableError, match="not one of"):
        gpu.pick_adapter()


def test_missing_backend_makes_the_engine_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_WGPU_BACKEND", "metal" if gpu.context().backend.lower() != "metal" else "dx12")
    with pytest.raises(gpu.WgpuUnavailableError, match="no WebGPU adapter"):
        gpu.pick_adapter()


def test_one_submission_per_partition_call() -> None:
    model, (x,) = MODELS["transformer_layer"]()
    compiled = _compile(model, fallback="error")
    with torch.no_grad():
        compiled(x)
        tb_wgpu.reset_stats()
        for _ in range(3):
            compiled(x)
    stats = tb_wgpu.stats()
    # transformer_layer compiles to one wgpu partition: 3 calls, 3 submissions, 3 readbacks.
    assert stats["submissions"] == 3, stats
    assert stats["readbacks"] == 3, stats
    assert stats["dispatches"] >= 3 * 5, stats  # many kernels, still one submission each call


def test_parameters_are_uploaded_once_across_ten_calls() -> None:
    model, (x,) = MODELS["readme_mlp"]()
    compiled = _compile(model, fallback="error")
    tb_wgpu.reset_stats()
    with torch.no_grad():
        for _ in range(10):
            out = compiled(x)
    n_params = len(list(model.parameters()))
    stats = tb_wgpu.stats()
    assert stats["param_uploads"] == n_params, stats
    assert stats["uploads"] == n_params + 10, stats  # the activation goes up every call
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


def test_changed_parameter_is_uploaded_again() -> None:
    model, (x,) = MODELS["readme_mlp"]()
    compiled = _compile(model, fallback="error")
    with torch.no_grad():
        compiled(x)
        tb_wgpu.reset_stats()
        model.fc2.bias.add_(1.0)  # bumps the version counter
        out = compiled(x)
        expected = model(x)
    assert tb_wgpu.stats()["param_uploads"] == 1
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_matmul_relu_epilogue_is_fused() -> None:
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(nn.functional.linear(x, w, b))

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="torchburn", options={"engine": "wgpu", "fallback": "error", "warn": False})
    x, w, b = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    compiled(x, w, b)
    tb_wgpu.reset_stats()
    torch.testing.assert_close(compiled(x, w, b), f(x, w, b), rtol=1e-4, atol=1e-4)
    assert tb_wgpu.stats()["dispatches"] == 1


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_set_matches_eager_with_ops_native(name: str) -> None:
    if name == "tiny_causal_lm":
        pytest.importorskip("transformers")
    model, args = MODELS[name]()
    compiled = _compile(model)
    torchburn.reset_stats()
    with torch.no_grad():
        expected = model(*args)
        actual = compiled(*args)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    cov = torchburn.op_coverage(by_engine=True)
    native = {k.split(":", 1)[1] for k in cov["native"] if k.startswith("wgpu:")}
    # Every node of every model on wgpu: no eager fallback at all (the tiny LM's int64 causal
    # mask included: arange, int64 add/sub, cat, cumsum, index, compares).
    assert not cov["fallback"], cov["fallback"]
    assert native, cov
    if name == "tiny_causal_lm":
        assert {
            "aten.mm.default",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten.embedding.default",
            "aten.arange.start_step",
            "aten.index.Tensor",
            "aten.cumsum.default",
        } <= native, native


def test_oversized_buffer_is_a_clear_error() -> None:
    ctx = gpu.context()
    with pytest.raises(gpu.WgpuOutOfMemoryError, match="binding size"):
        ctx.acquire(ctx.max_binding + 4)
    # the process (and the device) are still usable
    assert ctx.acquire(1024).size >= 1024


def test_device_loss_is_a_clear_error_and_falls_back_to_eager() -> None:
    model, (x,) = MODELS["readme_mlp"]()
    strict = _compile(model, fallback="error")
    with torch.no_grad():
        strict(x)
        gpu.context().destroy()
        with pytest.raises(Exception, match="lost"):
            strict(x)
        # tb-core's runner falls back to eager when a partition raises; the answer stays right.
        lenient = _compile(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = lenient(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    # A new device is opened for the next compile.
    assert gpu.context().lost is False
    again = _compile(model, fallback="error")
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", ["tiled", "direct"])
@pytest.mark.parametrize("shape", [(17, 33, 9), (70, 130, 65), (3, 64, 128)])
def test_both_matmul_kernels_match_eager(
    kernel: str, shape: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHBURN_WGPU_MATMUL", kernel)
    m, k, n = shape

    def f(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(torch.addmm(bias, a, b.t()))

    torch._dynamo.reset()
    torchburn.clear_cache()
    compiled = torch.compile(
        f, backend="torchburn", options={"engine": "wgpu", "fallback": "error", "warn": False, "cache": False}
    )
    a, b, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    torch.testing.assert_close(compiled(a, b, bias), f(a, b, bias), rtol=1e-4, atol=1e-4)
