"""tb-llm on the wgpu engine's LLM backend, end to end: whole tiny checkpoints against tb-llm's
PyTorch reference (same greedy tokens in fp32, close logits when quantized), one queue submission
per token through ``generate``, both GEMV kernels, chat rewinds and batches. Needs tb-llm, tb-wgpu
and transformers together (the engine's own tests need neither); skipped without a WebGPU adapter."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tb_wgpu
from tb_llm import LLM
from tb_llm.backends import ComposedBackend, ReferenceBackend
from tb_llm.config import load_config
from tb_llm.model import Decoder
from tb_llm.safetensors_io import CheckpointWeights
from tb_wgpu import device as gpu
from tb_wgpu.llm import FusedStep, GpuWeight, WgpuLLMBackend
from torchburn.llm import DeclinedWeight

warnings.filterwarnings("ignore", message=".*torchburn skipped.*")
_ctx, _reason = gpu.probe()
pytestmark = pytest.mark.skipif(_ctx is None, reason=f"no WebGPU adapter: {_reason}")


def wgpu_backend(**options: Any) -> ComposedBackend:
    """The wgpu backend as tb-llm runs it: composed with the reference for what it declines."""
    return ComposedBackend(WgpuLLMBackend(**options), ReferenceBackend("cpu"))


PROMPT = "Hello world! How are you"
# gemma (norm offset, embedding scale, tanh GELU) is covered by gemma2; RoPE variants only change
# the cos/sin tables the host computes.
ARCHS = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2"]


@pytest.fixture(scope="module")
def backend() -> Any:
    return wgpu_backend()


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


def test_both_gemv_kernels_give_the_same_tokens(ckpt: Callable[[str], Path], backend: Any) -> None:
    folder = ckpt("qwen2")
    prompt = LLM.from_pretrained(folder, engine="reference").encode(PROMPT)
    got = {}
    for kernel in ("tiled", "direct"):
        dec = _decoder(folder, wgpu_backend(linear=kernel), "int8")
        assert dec.lm_head.handle.layout == ("rows" if kernel == "tiled" else "cols")
        got[kernel] = [int(g.argmax()) for g in _greedy_logits(dec, prompt, 10)]
    assert got["tiled"] == got["direct"]


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
    dec = _decoder(folder, wgpu_backend(), quant)
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
    be = wgpu_backend(f16=f16)
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
    dec = _decoder(folder, wgpu_backend(), "fp32")
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
    be = wgpu_backend()
    vocab_bytes = load_config(folder / "config.json").vocab_size * 64 * 4
    monkeypatch.setattr(be.ctx, "max_binding", vocab_bytes - 4)  # the head no longer fits
    dec = _decoder(folder, be, "fp32")
    monkeypatch.undo()
    assert dec._fused is None
    assert isinstance(dec.lm_head.handle, DeclinedWeight) and isinstance(dec.layers[0].o.handle, GpuWeight)
    ref = _decoder(folder, DequantReference(), "fp32")
    prompt = LLM.from_pretrained(folder, engine="reference").encode(PROMPT)
    got = _greedy_logits(dec, prompt, 4)
    want = _greedy_logits(ref, prompt, 4, feed=[int(g.argmax()) for g in got[:-1]])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
