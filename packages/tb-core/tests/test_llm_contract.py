"""torchburn.llm, the contract between tb-llm and engine LLM backends: the weight formats and the
quantizer, the KV cache, the model description and its forward pass, the package's names."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from typing import Any

import pytest
import torch

import torchburn
import torchburn.llm as tl
from torchburn.llm import __main__ as llm_main
from torchburn.testing.llm_conformance import MODEL_SPECS, ModelSpec, random_model


# -- names ---------------------------------------------------------------------------------------
def test_importing_the_contract_never_imports_tb_llm() -> None:
    code = "import sys, torchburn.llm, torchburn.llm_backend, torchburn.testing; print('tb_llm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"


def test_torchburn_LLM_stays_a_lazy_alias_next_to_the_llm_package(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(torchburn.llm, types.ModuleType) and torchburn.llm is tl
    fake = types.ModuleType("tb_llm")
    fake.LLM = type("LLM", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tb_llm", fake)
    assert torchburn.LLM is fake.LLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tb_llm", None)  # as if tb-llm were not installed
    with pytest.raises(ImportError, match="pip install tb-llm"):
        torchburn.LLM  # noqa: B018


def test_llm_backend_module_re_exports_the_descriptor() -> None:
    from torchburn import llm_backend

    assert llm_backend.LLMBackend is tl.LLMBackend and llm_backend.llm_backends is tl.llm_backends
    assert tl.LLMBackend("x", "x", "cpu", lambda: None).protocol_version == 1  # written before the move


def test_python_dash_m_torchburn_llm(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert llm_main.main(["chat"]) == 2
    assert "pip install tb-llm" in capsys.readouterr().err
    seen: list[Any] = []
    cli = types.ModuleType("tb_llm.cli")

    def fake_main(argv: Any) -> int:
        seen.append(argv)
        return 0

    cli.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tb_llm", types.ModuleType("tb_llm"))
    monkeypatch.setitem(sys.modules, "tb_llm.cli", cli)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert llm_main.main(["generate", "--model", "m", "hi"]) == 0
    assert seen == [["generate", "--model", "m", "hi"]]


def test_errors() -> None:
    assert issubclass(tl.ProtocolVersionError, tl.BackendError)
    assert issubclass(tl.BackendError, tl.LLMError) and issubclass(tl.BackendError, RuntimeError)


# -- weight formats -------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "k"), [(1, 32), (7, 96), (33, 256)])
def test_int8_layout(n: int, k: int) -> None:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(k))
    q = tl.quantize(w, "int8")
    assert q.kind == "int8" and q.shape == (n, k) and q.qweight is not None and q.scales is not None
    assert q.qweight.dtype == torch.int8 and q.scales.shape == (n,) and q.scales.dtype == torch.float32
    assert int(q.qweight.min()) >= -127
    torch.testing.assert_close(q.dequantize(), q.qweight.float() * q.scales[:, None], rtol=0, atol=0)
    assert bool(((q.dequantize() - w).abs() <= q.scales[:, None] * 0.5001).all())


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_layout(group: int) -> None:
    w = torch.randn(9, 384, generator=torch.Generator().manual_seed(group)) * 2
    q = tl.quantize(w, "int4", group)
    assert q.kind == "int4" and q.group_size == group and q.qweight is not None
    assert q.qweight.dtype == torch.uint8 and q.qweight.shape == (9, 192)
    assert q.scales is not None and q.zeros is not None and q.scales.shape == (9, 384 // group)
    for t in (q.scales, q.zeros):  # float16 values in float32 tensors: a backend may store them as float16
        assert t.dtype == torch.float32 and torch.equal(t.half().float(), t)
    codes = tl.unpack_int4(q.qweight).float().reshape(9, -1, group)
    manual = (codes - 8) * q.scales[..., None] + q.zeros[..., None]
    torch.testing.assert_close(q.dequantize(), manual.reshape(9, 384), rtol=0, atol=0)
    err = (q.dequantize() - w).abs().reshape(9, -1, group)
    assert bool((err <= (q.scales * 0.51 + q.zeros.abs() * 2.0**-11 + 1e-6)[..., None]).all())


def test_int4_edge_cases() -> None:
    assert tl.quantize(torch.randn(4, 48), "int4", 32).kind == "int8"  # K not a multiple of the group
    with pytest.raises(ValueError, match="group size"):
        tl.quantize(torch.randn(4, 96), "int4", 48)
    big = torch.randn(4, 64)
    big[1, 3] = 1e6
    with pytest.raises(ValueError, match=r"1 row\(s\).*beyond float16"):
        tl.quantize(big, "int4", 32)
    with pytest.raises(ValueError, match="unknown quantization"):
        tl.quantize(big, "int3")


def test_pack_unpack_and_rows() -> None:
    codes = torch.randint(0, 16, (5, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = tl.pack_int4(codes)
    assert packed.shape == (5, 32) and int(packed[0, 0]) == int(codes[0, 0]) | (int(codes[0, 1]) << 4)
    assert torch.equal(tl.unpack_int4(packed), codes)
    for kind in tl.QUANTS:
        q = tl.quantize(torch.randn(20, 64), kind, 32)
        ids = torch.tensor([[3, 0], [19, 3]])
        assert torch.equal(q.rows(ids, torch.float32), q.dequantize(torch.float32)[ids])
    dense = torch.randn(3, 4)
    assert tl.quantize(dense, "fp32").weight is dense  # no copy of a float32 checkpoint tensor
    assert tl.quantize(dense, "bf16").dequantize(torch.bfloat16).dtype == torch.bfloat16


def test_activation_names() -> None:
    assert tl.Activation.from_name("silu") is tl.Activation.SILU
    assert str.__eq__(tl.Activation.SILU, "silu")  # a str enum: code comparing names keeps working
    assert tl.Activation.from_name("gelu") is tl.Activation.GELU
    for name in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_tanh"):
        assert tl.Activation.from_name(name) is tl.Activation.GELU_TANH
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        tl.Activation.from_name("relu")


def test_default_head_quant() -> None:
    assert [tl.default_head_quant(q) for q in tl.QUANTS] == ["fp32", "bf16", "int8", "int8"]


# -- the KV cache ---------------------------------------------------------------------------------
def _cache(capacity: int, batch: int = 2) -> tl.KVCache:
    return tl.KVCache(2, batch, 2, 4, capacity, torch.float32, torch.device("cpu"))


def test_kv_cache_protocol() -> None:
    c = _cache(3)
    gen0 = c.generation
    c.begin(torch.tensor([[0, 1], [-1, 0]]))
    k, v = torch.randn(2, 2, 2, 4), torch.randn(2, 2, 2, 4)
    ka, va = c.write(1, k, v)
    assert ka.shape == (2, 2, 2, 4) and torch.equal(ka, k) and torch.equal(va, v)
    c.commit(2)
    assert c.length == 2 and c.generation == gen0 and c.capacity == 3
    c.begin(torch.tensor([[2, 3], [1, 2]]))  # 4 slots > 3: the buffers double and are replaced
    assert c.capacity == 6 and c.generation == gen0 + 1
    assert torch.equal(c.keys(1)[:, :, :2], k) and torch.equal(c.values(1)[:, :, :2], v)  # copied over
    c.keys(0)[:, :, 2:4] = 1.0  # an engine writes the claimed slots in place
    c.commit(2)
    assert torch.equal(c.pos[:, :4], torch.tensor([[0, 1, 2, 3], [-1, 0, 1, 2]]))
    c.truncate(1)
    assert c.length == 1 and bool((c.pos[:, 1:] == -1).all())
    assert c.nbytes() == 2 * 2 * (2 * 2 * 6 * 4) * 4


# -- the model description and its forward pass -----------------------------------------------------
def _spec(spec_id: str) -> ModelSpec:
    return next(s for s in MODEL_SPECS if s.id == spec_id)


def test_model_description_checks_itself() -> None:
    model = random_model(_spec("phi3"), lambda w: w)
    assert model.num_layers == 2 and not model.sandwich_norms and model.activation is tl.Activation.SILU
    assert len(model.linears()) == 2 * 4 + 1 and model.linears()[-1] is model.lm_head
    assert random_model(_spec("gemma2"), lambda w: w).sandwich_norms
    import dataclasses

    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dataclasses.replace(model, num_kv_heads=3)
    with pytest.raises(ValueError, match="rotary_dim=7"):
        dataclasses.replace(model, rotary_dim=7)
    assert dataclasses.replace(model, activation="gelu_new").activation is tl.Activation.GELU_TANH  # type: ignore[arg-type]


def _run(model: tl.ModelDescription, ids: torch.Tensor, pos: torch.Tensor, cache: tl.KVCache, last: bool) -> Any:
    return tl.forward(model, tl.ReferenceKernels(), ids, pos, cache, last)


@pytest.mark.parametrize("spec_id", [s.id for s in MODEL_SPECS if s.quant == "fp32"])
def test_decoding_token_by_token_equals_one_prefill(spec_id: str) -> None:
    model = random_model(_spec(spec_id), lambda w: w)
    ids = torch.tensor([[7, 3, 9, 1, 4, 4, 8, 2]])
    whole = _run(model, ids, torch.arange(8)[None], tl.KVCache(2, 1, 2, 16, 8, torch.float32, model.device), False)
    cache = tl.KVCache(2, 1, 2, 16, 1, torch.float32, model.device)  # grows on the way
    steps = [_run(model, ids[:, i : i + 1], torch.tensor([[i]]), cache, True) for i in range(8)]
    torch.testing.assert_close(torch.stack(steps, dim=1), whole, rtol=1e-5, atol=1e-5)
    if model.final_softcap:
        assert float(whole.abs().max()) < model.final_softcap


def test_a_left_padded_row_gives_its_prompt_alone() -> None:
    model = random_model(_spec("gemma2"), lambda w: w)  # sliding window 4 on layer 0, softcaps
    ids = torch.tensor([[5, 9, 11, 3, 7, 2], [0, 0, 0, 12, 4, 1]])
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [-1, -1, -1, 0, 1, 2]])
    both = _run(model, ids, pos, tl.KVCache(2, 2, 2, 16, 6, torch.float32, model.device), True)
    alone = _run(model, ids[1:, 3:], pos[1:, 3:], tl.KVCache(2, 1, 2, 16, 3, torch.float32, model.device), True)
    torch.testing.assert_close(both[1:], alone, rtol=1e-5, atol=1e-5)


def test_a_sliding_window_longer_than_the_sequence_changes_nothing() -> None:
    import dataclasses

    model = random_model(_spec("gemma2"), lambda w: w)
    wide = dataclasses.replace(model, sliding_window=64)
    no_window = dataclasses.replace(model, sliding_window=None)
    ids, pos = torch.tensor([[5, 9, 11, 3, 7, 2, 8]]), torch.arange(7)[None]

    def logits(m: tl.ModelDescription) -> torch.Tensor:
        return _run(m, ids, pos, tl.KVCache(2, 1, 2, 16, 7, torch.float32, m.device), False)  # type: ignore[no-any-return]

    torch.testing.assert_close(logits(wide), logits(no_window), rtol=0, atol=0)
    assert not torch.allclose(logits(model), logits(no_window))  # the window of 4 does change layer 0
