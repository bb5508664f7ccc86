"""The ``wgpu`` LLM backend with tb-core and torch only: the conformance suite with each GEMV kernel,
the in-shader dequantizing linear against float64, and the fused step on tb-core model
descriptions (one queue submission per forward, weights uploaded once, the device cache resynced
from a host cache written by someone else). Whole checkpoints through tb-llm:
integration_tests/test_llm_wgpu.py. Without a WebGPU adapter conftest.py skips everything."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tb_wgpu
from tb_wgpu import device as gpu
from tb_wgpu.llm import FusedStep, GpuWeight, WgpuLLMBackend
from torchburn.llm import KVCache, ModelDescription, QuantWeight, ReferenceKernels, forward, quantize
from torchburn.testing import LLMBackendConformance
from torchburn.testing.llm_conformance import MODEL_SPECS, ModelSpec, random_model


class TestWgpuLLMBackendTiled(LLMBackendConformance):
    """The cooperative GEMV (a workgroup per output: GPUs' default)."""

    backend_type = WgpuLLMBackend
    engine = "wgpu"

    def make_backend(self) -> Any:
        return WgpuLLMBackend(linear="tiled")


class TestWgpuLLMBackendDirect(TestWgpuLLMBackendTiled):
    """The barrier-free GEMV over transposed weights (CPU adapters' default, lavapipe)."""

    def make_backend(self) -> Any:
        return WgpuLLMBackend(linear="direct")


@pytest.fixture(scope="module")
def backend() -> WgpuLLMBackend:
    return WgpuLLMBackend()


@pytest.fixture(scope="module", params=["tiled", "direct"])
def any_linear(request: pytest.FixtureRequest) -> WgpuLLMBackend:
    """A backend with each GEMV kernel (and its weight layout), whatever the adapter's default."""
    return WgpuLLMBackend(linear=request.param)


def test_load_without_an_adapter_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tb_wgpu import plugin

    monkeypatch.setattr(gpu, "probe", lambda: (None, "no Vulkan driver"))
    with pytest.raises(gpu.WgpuUnavailableError, match="needs a WebGPU adapter: no Vulkan driver"):
        plugin._load_llm_backend()


# -- the linear kernel ---------------------------------------------------------------------------
def _check_linear(be: WgpuLLMBackend, w: QuantWeight, m: int, bias: bool, rtol: float) -> None:
    torch.manual_seed(m * 7 + w.shape[0])
    n, k = w.shape
    x = torch.randn(m, k)
    b = torch.randn(n) if bias else None
    got = be.linear(x, be.prepare_linear(w), b)
    want = x.double() @ w.dequantize(torch.float64).T
    if b is not None:
        want = want + b.double()
    # f32 accumulation over K terms: error ~ K * eps * sum |x w|
    scale = (x.abs().double() @ w.dequantize(torch.float64).abs().T).float()
    torch.testing.assert_close(got, want.float(), rtol=0, atol=float((rtol * scale).max()) + 1e-5)


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8", "int4"])
@pytest.mark.parametrize(("n", "k"), [(1, 64), (37, 128), (130, 256), (5, 67)])
def test_linear_dequantizes_in_the_shader(any_linear: WgpuLLMBackend, kind: str, n: int, k: int) -> None:
    w = quantize(torch.randn(n, k), kind, 32)  # int4 with K % 32 != 0 is stored as int8
    for m, bias in ((1, False), (3, True), (6, False)):
        _check_linear(any_linear, w, m, bias, rtol=2e-6 * k)


@pytest.mark.parametrize("group", [64, 128])
def test_int4_group_sizes(any_linear: WgpuLLMBackend, group: int) -> None:
    w = quantize(torch.randn(24, 384) * 3, "int4", group)
    assert w.kind == "int4"
    _check_linear(any_linear, w, 2, True, rtol=1e-3)


def test_bf16_weights_f16_on_gpus_with_shader_f16_and_exact_bf16_otherwise(backend: WgpuLLMBackend) -> None:
    ctx = backend.ctx
    w = quantize(torch.randn(16, 64), "bf16")
    assert backend.prepare_linear(w).kind == ("f16" if ctx.shader_f16 and not ctx.is_software else "bf16")
    f32_path = WgpuLLMBackend(f16=False)
    assert f32_path.prepare_linear(w).kind == "bf16"  # packed bf16 widened to f32 in-shader: exact
    _check_linear(f32_path, w, 2, False, rtol=1e-6)
    if not ctx.shader_f16:
        with pytest.raises(gpu.WgpuError, match="shader-f16"):
            WgpuLLMBackend(f16=True)
        return
    f16_path = WgpuLLMBackend(f16=True)
    assert f16_path.prepare_linear(w).kind == "f16"  # bf16 values in f16's normal range are exact
    _check_linear(f16_path, w, 2, False, rtol=1e-6)
    big = quantize(torch.full((4, 8), 1e5), "bf16")  # out of f16's range: keeps the exact form
    assert f16_path.prepare_linear(big).kind == "bf16"


def test_declines_what_it_does_not_run(backend: WgpuLLMBackend) -> None:
    for kernel in ("rms_norm", "rope", "attention", "gated_act", "embedding"):
        assert not hasattr(backend, kernel)  # tb-llm's reference runs these in the per-kernel path
    odd = QuantWeight("int3", (4, 8))
    assert backend.prepare_linear(odd) is NotImplemented
    with pytest.raises(RuntimeError, match="not a handle it prepared"):
        backend.linear(torch.randn(1, 8), object(), None)


# -- the fused step on tb-core model descriptions ------------------------------------------------
def _spec(spec_id: str) -> ModelSpec:
    return next(s for s in MODEL_SPECS if s.id == spec_id)


def _cache(model: ModelDescription, capacity: int, batch: int = 1) -> KVCache:
    return KVCache(
        model.num_layers, batch, model.num_kv_heads, model.head_dim, capacity, torch.float32, torch.device("cpu")
    )


def test_one_submission_per_forward_and_weights_uploaded_once() -> None:
    be = WgpuLLMBackend()
    model = random_model(_spec("llama-int4"), be.prepare_linear)
    assert be.stats["weight_uploads"] > 0
    step = be.compile_model(model)
    assert isinstance(step, FusedStep)
    uploads, nbytes = be.stats["weight_uploads"], be.stats["weight_bytes"]  # + the norms and biases
    cache = _cache(model, 4)
    before, engine_before = be.stats["submissions"], tb_wgpu.stats()["submissions"]
    step(torch.tensor([[5, 9, 11]]), torch.arange(3)[None], cache, True)
    for i in range(3, 9):  # decode past the initial capacity: the cache grows and is re-bound
        step(torch.tensor([[i]]), torch.tensor([[i]]), cache, True)
    assert be.stats["submissions"] - before == 7
    assert tb_wgpu.stats()["submissions"] - engine_before == 7
    assert (be.stats["weight_uploads"], be.stats["weight_bytes"]) == (uploads, nbytes)


def test_resyncs_from_a_cache_written_by_someone_else() -> None:
    """The per-kernel path (here tb-core's reference forward over the same weights) fills the host
    cache; the fused step then finds the device copy stale, re-uploads it, and continues exactly."""
    be = WgpuLLMBackend()
    spec = _spec("gemma2")  # sliding window 4: the decode steps run past it
    model = random_model(spec, be.prepare_linear)
    ref_model = random_model(spec, lambda w: w)
    ref = ReferenceKernels()
    step = be.compile_model(model)
    assert step is not None
    prompt = torch.tensor([[5, 9, 11, 3, 7, 2]])
    pos = torch.arange(6)[None]
    cache, ref_cache = _cache(model, 4), _cache(model, 4)  # small: it grows (and moves) on the way
    forward(ref_model, ref, prompt, pos, cache, True)
    want = forward(ref_model, ref, prompt, pos, ref_cache, True)
    syncs = be.stats["cache_syncs"]
    nxt = 6
    for _ in range(8):
        tok = torch.tensor([[int(want.argmax())]])
        got = step(tok, torch.tensor([[nxt]]), cache, True)
        want = forward(ref_model, ref, tok, torch.tensor([[nxt]]), ref_cache, True)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        nxt += 1
    assert be.stats["cache_syncs"] > syncs
    torch.testing.assert_close(cache.keys(0)[:, :, :nxt], ref_cache.keys(0)[:, :, :nxt], rtol=1e-4, atol=1e-5)


def test_weight_over_the_binding_limit_is_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight larger than a storage binding stays with tb-llm's reference (declined), so the
    whole-model compile declines too and the model runs kernel by kernel."""
    from torchburn.llm import DeclinedWeight

    be = WgpuLLMBackend()
    monkeypatch.setattr(be.ctx, "max_binding", 96 * 64 * 4 - 4)  # the 96 x 64 fp32 head no longer fits

    def prepare(w: QuantWeight) -> Any:
        handle = be.prepare_linear(w)
        return DeclinedWeight(w) if handle is NotImplemented else handle

    model = random_model(_spec("llama"), prepare)
    monkeypatch.undo()
    assert isinstance(model.lm_head.handle, DeclinedWeight)
    assert isinstance(model.layers[0].o.handle, GpuWeight)
    assert be.compile_model(model) is None
