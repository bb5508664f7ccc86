"""tb-llm's ``wgpu`` backend: the in-shader dequantizing linear against float64, and whole tiny
models against tb-llm's PyTorch reference (same greedy tokens in fp32, close logits when
quantized), one queue submission per forward, weights uploaded once, chat rewinds and batches."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

tb_llm = pytest.importorskip(
    "tb_llm", reason="the LLM backend is tested where tb-llm is installed (nox -s integration)"
)
pytest.importorskip("transformers", reason="tiny test checkpoints are written with transformers")

import tb_wgpu  # noqa: E402
from tb_llm import LLM  # noqa: E402
from tb_llm.backends import ReferenceBackend  # noqa: E402
from tb_llm.config import load_config  # noqa: E402
from tb_llm.model import Decoder  # noqa: E402
from tb_llm.quant import quantize  # noqa: E402
from tb_llm.safetensors_io import CheckpointWeights  # noqa: E402
from tb_wgpu import device as gpu  # noqa: E402
from tb_wgpu.llm import FusedStep, GpuWeight, backend_class  # noqa: E402

warnings.filterwarnings("ignore", message=".*torchburn skipped.*")

PROMPT = "Hello world! How are you"
# gemma (norm offset, embedding scale, tanh GELU) is covered by gemma2; RoPE variants only change
# the cos/sin tables the host computes.
ARCHS = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2"]


@pytest.fixture(scope="module")
def backend() -> Any:
    ctx, reason = gpu.probe()
    if ctx is None:
        pytest.skip(f"no WebGPU adapter: {reason}")
    return backend_class()()


@pytest.fixture(scope="module", params=["tiled", "direct"])
def any_linear(request: pytest.FixtureRequest, backend: Any) -> Any:
    """A backend with each GEMV kernel (and its weight layout), whatever the adapter's default."""
    return backend_class()(linear=request.param)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    from tb_llm.testing import make_checkpoint

    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = make_checkpoint(arch, tmp_path_factory.mktemp(arch) / "model")
        return made[arch]

    return get


class DequantReference(ReferenceBackend):
    """What the wgpu backend promises to compute: f32 activations over exactly dequantized
    weights, the same head storage (int8 for int8 / int4 models), every kernel in PyTorch."""

    name = "dequant-reference"

    def compute_dtype(self, quant: str) -> torch.dtype:
        return torch.float32

    def head_quant(self, quant: str) -> str:
        return "int8" if quant in ("int8", "int4") else quant

    def prepare_linear(self, w: Any) -> Any:
        return w.dequantize(torch.float64)

    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        y = (x.double() @ handle.T).float()
        return y if bias is None else y + bias


def _decoder(folder: Path, be: Any, quant: str) -> Decoder:
    return Decoder(load_config(folder / "config.json"), CheckpointWeights(folder), be, quant)


def _greedy_logits(dec: Decoder, prompt: list[int], steps: int, feed: list[int] | None = None) -> list[torch.Tensor]:
    """Logits of the prefill and of ``steps`` decode steps, feeding ``feed`` (or the argmax)."""
    cache = dec.new_cache(1, len(prompt) + steps + 1)
    ids = torch.tensor([prompt])
    pos = torch.arange(len(prompt))[None]
    out = [dec.forward(ids, pos, cache)]
    nxt = len(prompt)
    for i in range(steps):
        tok = feed[i] if feed is not None else int(out[-1].argmax())
        out.append(dec.forward(torch.tensor([[tok]]), torch.tensor([[nxt]]), cache))
        nxt += 1
    return out


# -- registration --------------------------------------------------------------------------------
def test_registered_as_the_wgpu_gpu_backend(ckpt: Callable[[str], Path], backend: Any) -> None:
    from torchburn.llm_backend import llm_backends

    desc = [b for b in llm_backends() if b.engine == "wgpu"]
    assert len(desc) == 1 and desc[0].device == "gpu" and desc[0].name == "wgpu"
    llm = LLM.from_pretrained(ckpt("llama"), engine="wgpu")
    assert llm.backend.name == "wgpu" and llm.engine == "wgpu"
    assert isinstance(llm.model._fused, FusedStep)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a CUDA GPU, device='gpu' means PyTorch's CUDA kernels")
def test_device_gpu_without_a_torch_gpu_runs_on_wgpu(ckpt: Callable[[str], Path]) -> None:
    llm = LLM.from_pretrained(ckpt("llama"), device="gpu")
    assert llm.engine == "wgpu" and llm.model.device.type == "cpu"
    ref = LLM.from_pretrained(ckpt("llama"), device="cpu", engine="reference")
    prompt = "The quick brown fox"
    assert llm.generate(prompt, max_new_tokens=8).token_ids == ref.generate(prompt, max_new_tokens=8).token_ids


def test_load_without_an_adapter_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tb_wgpu import plugin

    monkeypatch.setattr(gpu, "probe", lambda: (None, "no Vulkan driver"))
    with pytest.raises(gpu.WgpuUnavailableError, match="needs a WebGPU adapter: no Vulkan driver"):
        plugin._load_llm_backend()


# -- the linear kernel ---------------------------------------------------------------------------
def _check_linear(be: Any, w: Any, m: int, bias: bool, rtol: float) -> None:
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
def test_linear_dequantizes_in_the_shader(any_linear: Any, kind: str, n: int, k: int) -> None:
    w = quantize(torch.randn(n, k), kind, 32)  # int4 with K % 32 != 0 is stored as int8 by tb-llm
    for m, bias in ((1, False), (3, True), (6, False)):
        _check_linear(any_linear, w, m, bias, rtol=2e-6 * k)


@pytest.mark.parametrize("group", [64, 128])
def test_int4_group_sizes(any_linear: Any, group: int) -> None:
    w = quantize(torch.randn(24, 384) * 3, "int4", group)
    assert w.kind == "int4"
    _check_linear(any_linear, w, 2, True, rtol=1e-3)


def test_both_gemv_kernels_give_the_same_tokens(ckpt: Callable[[str], Path], backend: Any) -> None:
    folder = ckpt("qwen2")
    prompt = LLM.from_pretrained(folder, engine="reference").encode(PROMPT)
    got = {}
    for kernel in ("tiled", "direct"):
        dec = _decoder(folder, backend_class()(linear=kernel), "int8")
        assert dec.lm_head.handle.layout == ("rows" if kernel == "tiled" else "cols")
        got[kernel] = [int(g.argmax()) for g in _greedy_logits(dec, prompt, 10)]
    assert got["tiled"] == got["direct"]


def test_bf16_weights_f16_on_gpus_with_shader_f16_and_exact_bf16_otherwise(backend: Any) -> None:
    ctx = backend.ctx
    w = quantize(torch.randn(16, 64), "bf16")
    assert backend.prepare_linear(w).kind == ("f16" if ctx.shader_f16 and not ctx.is_software else "bf16")
    f32_path = backend_class()(f16=False)
    assert f32_path.prepare_linear(w).kind == "bf16"  # packed bf16 widened to f32 in-shader: exact
    _check_linear(f32_path, w, 2, False, rtol=1e-6)
    if not ctx.shader_f16:
        with pytest.raises(gpu.WgpuError, match="shader-f16"):
            backend_class()(f16=True)
        return
    f16_path = backend_class()(f16=True)
    assert f16_path.prepare_linear(w).kind == "f16"  # bf16 values in f16's normal range are exact
    _check_linear(f16_path, w, 2, False, rtol=1e-6)
    big = quantize(torch.full((4, 8), 1e5), "bf16")  # out of f16's range: keeps the exact form
    assert f16_path.prepare_linear(big).kind == "bf16"


# -- whole models --------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_reference_fp32(ckpt: Callable[[str], Path], arch: str) -> None:
    folder = ckpt(arch)
    llm = LLM.from_pretrained(folder, engine="wgpu")
    ref = LLM.from_pretrained(folder, engine="reference")
    prompt = llm.encode(PROMPT)
    before = llm.backend.stats["submissions"]
    got = llm.generate(prompt, max_new_tokens=32, ignore_eos=True)
    assert got.token_ids == ref.generate(prompt, max_new_tokens=32, ignore_eos=True).token_ids
    # one submission for the prefill and one per decode step (the last token is never fed back)
    assert llm.backend.stats["submissions"] - before == 32


@pytest.mark.parametrize(
    ("arch", "quant"),
    [
        ("llama", "int8"),
        ("llama", "int4"),
        ("llama", "bf16"),
        ("qwen3", "int4"),
        ("gemma2", "int8"),
        ("gemma2", "int4"),
    ],
)
def test_quantized_logits_match_the_dequantized_reference(ckpt: Callable[[str], Path], arch: str, quant: str) -> None:
    folder = ckpt(arch)
    dec = _decoder(folder, backend_class()(), quant)
    ref = _decoder(folder, DequantReference(), quant)
    prompt = LLM.from_pretrained(folder, engine="reference").encode(PROMPT)
    got = _greedy_logits(dec, prompt, 8)
    want = _greedy_logits(ref, prompt, 8, feed=[int(g.argmax()) for g in got[:-1]])
    for g, w in zip(got, want):
        assert int(g.argmax()) == int(w.argmax())
        torch.testing.assert_close(g, w, rtol=1e-4, atol=2e-4 * float(w.abs().max()))


@pytest.mark.parametrize("f16", [False, True], ids=["f32-path", "f16-path"])
def test_bf16_model_on_each_weight_path(ckpt: Callable[[str], Path], backend: Any, f16: bool) -> None:
    if f16 and not backend.ctx.shader_f16:
        pytest.skip(f"{backend.ctx.adapter_name} does not offer shader-f16")
    folder = ckpt("qwen2")
    be = backend_class()(f16=f16)
    dec = _decoder(folder, be, "bf16")
    assert {lin.handle.kind for lin in dec.layers[0].qkv} == {"f16" if f16 else "bf16"}
    ref = _decoder(folder, DequantReference(), "bf16")
    prompt = LLM.from_pretrained(folder, engine="reference").encode(PROMPT)
    got = _greedy_logits(dec, prompt, 6)
    want = _greedy_logits(ref, prompt, 6, feed=[int(g.argmax()) for g in got[:-1]])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * float(w.abs().max()))


def test_one_submission_per_token_and_weights_uploaded_once(ckpt: Callable[[str], Path]) -> None:
    llm = LLM.from_pretrained(ckpt("llama"), quant="int4", engine="wgpu")
    stats = llm.backend.stats
    uploads, nbytes = stats["weight_uploads"], stats["weight_bytes"]
    assert uploads > 0
    for n in (5, 9, 3):
        engine_before = tb_wgpu.stats()["submissions"]
        before = stats["submissions"]
        out = llm.generate(PROMPT, max_new_tokens=n, ignore_eos=True)
        assert len(out.token_ids) == n
        assert stats["submissions"] - before == n  # prefill + (n - 1) decode steps
        assert tb_wgpu.stats()["submissions"] - engine_before == n
    assert (stats["weight_uploads"], stats["weight_bytes"]) == (uploads, nbytes)


def test_chat_turns_and_rewinds_match_reference(ckpt: Callable[[str], Path]) -> None:
    folder = ckpt("qwen3")
    llm = LLM.from_pretrained(folder, engine="wgpu")
    ref = LLM.from_pretrained(folder, engine="reference")
    a, b = llm.chat_session("Be brief."), ref.chat_session("Be brief.")
    for text in ("Hello there", "How are you today?", "Straße"):
        assert a.send(text, max_new_tokens=12).token_ids == b.send(text, max_new_tokens=12).token_ids
    a.reset()
    b.reset()
    assert a.send("Again", max_new_tokens=10).token_ids == b.send("Again", max_new_tokens=10).token_ids


def test_resyncs_from_a_cache_written_by_someone_else(ckpt: Callable[[str], Path]) -> None:
    folder = ckpt("mistral")
    dec = _decoder(folder, backend_class()(), "fp32")
    ref = _decoder(folder, DequantReference(), "fp32")
    prompt = LLM.from_pretrained(folder, engine="reference").encode(PROMPT)
    ids, pos = torch.tensor([prompt]), torch.arange(len(prompt))[None]
    cache, ref_cache = dec.new_cache(1, 4), ref.new_cache(1, 4)  # small: it grows (and moves) on the way
    dec.reference_forward(ids, pos, cache)  # the per-kernel path fills the host cache only
    want = ref.forward(ids, pos, ref_cache)
    syncs = dec.backend.stats["cache_syncs"]
    nxt = len(prompt)
    for _ in range(12):
        tok = torch.tensor([[int(want.argmax())]])
        got = dec.forward(tok, torch.tensor([[nxt]]), cache)
        want = ref.forward(tok, torch.tensor([[nxt]]), ref_cache)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        nxt += 1
    assert dec.backend.stats["cache_syncs"] > syncs
    torch.testing.assert_close(cache.k[0][:, :, :nxt], ref_cache.k[0][:, :, :nxt], rtol=1e-4, atol=1e-5)


def test_left_padded_batch_matches(ckpt: Callable[[str], Path]) -> None:
    folder = ckpt("gemma2")
    llm = LLM.from_pretrained(folder, engine="wgpu")
    ref = LLM.from_pretrained(folder, engine="reference")
    prompts = ["Hello world! How are you today, my friend?", "The quick fox"]
    got = llm.generate(prompts, max_new_tokens=16, ignore_eos=True)
    want = ref.generate(prompts, max_new_tokens=16, ignore_eos=True)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    single = llm.generate(prompts[1], max_new_tokens=16, ignore_eos=True)
    assert single.token_ids == got[1].token_ids


def test_all_positions_logits(ckpt: Callable[[str], Path]) -> None:
    folder = ckpt("phi3")
    dec = _decoder(folder, backend_class()(), "fp32")
    ref = _decoder(folder, DequantReference(), "fp32")
    ids = torch.tensor([[5, 9, 17, 33, 2, 40, 41]])
    pos = torch.arange(7)[None]
    got = dec.forward(ids, pos, dec.new_cache(1, 8), last_only=False)
    want = ref.forward(ids, pos, ref.new_cache(1, 8), last_only=False)
    assert got.shape == want.shape == (1, 7, dec.cfg.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_weight_over_the_binding_limit_uses_the_per_kernel_path(
    ckpt: Callable[[str], Path], backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = ckpt("llama")
    be = backend_class()()
    vocab_bytes = load_config(folder / "config.json").vocab_size * 64 * 4
    monkeypatch.setattr(be.ctx, "max_binding", vocab_bytes - 4)  # the head no longer fits
    dec = _decoder(folder, be, "fp32")
    monkeypatch.undo()
    assert dec._fused is None
    assert not isinstance(dec.lm_head.handle, GpuWeight) and isinstance(dec.layers[0].o.handle, GpuWeight)
    ref = _decoder(folder, DequantReference(), "fp32")
    prompt = LLM.from_pretrained(folder, engine="reference").encode(PROMPT)
    got = _greedy_logits(dec, prompt, 4)
    want = _greedy_logits(ref, prompt, 4, feed=[int(g.argmax()) for g in got[:-1]])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
