"""Quantization layouts and accuracy against fp32."""

from __future__ import annotations

import pytest
import torch

from tb_llm import LLM
from tb_llm.backends import ReferenceBackend
from tb_llm.quant import pack_int4, quantize, unpack_int4
from tb_llm.quant_accuracy import compare


def test_int4_pack_layout() -> None:
    q = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.tolist() == [[0x21, 0x0F]]  # column 2j in the low nibble, 2j+1 in the high one
    assert torch.equal(unpack_int4(packed), q)


@pytest.mark.parametrize(
    "kind,group,tol",
    [("int8", 32, 0.01), ("int4", 32, 0.08), ("int4", 64, 0.09), ("int4", 128, 0.1), ("bf16", 32, 0.01)],
)
def test_dequantize_error(kind: str, group: int, tol: float) -> None:
    torch.manual_seed(0)
    w = torch.randn(48, 256)
    qw = quantize(w, kind, group)
    err = (qw.dequantize() - w).norm() / w.norm()
    assert err < tol
    x = torch.randn(5, 256)
    be = ReferenceBackend("cpu")
    y = be.linear(x.to(be.compute_dtype(kind)), be.prepare_linear(qw), None).float()
    assert torch.allclose(y, x @ qw.dequantize().T, rtol=2e-2, atol=2e-2 * float(y.abs().max()))


def test_int4_falls_back_to_int8_when_groups_do_not_divide() -> None:
    assert quantize(torch.randn(8, 48), "int4", 32).kind == "int8"


@pytest.mark.parametrize("quant,min_top1,min_cos", [("bf16", 0.95, 0.999), ("int8", 0.9, 0.99), ("int4", 0.5, 0.9)])
def test_top1_agreement(llama_dir, quant: str, min_top1: float, min_cos: float) -> None:
    ref = LLM.from_pretrained(llama_dir, quant="fp32", device="cpu")
    q = LLM.from_pretrained(llama_dir, quant=quant, device="cpu")
    top1, cos = compare(ref, q, n_tokens=64)
    assert top1 >= min_top1, f"{quant}: top-1 agreement {top1:.3f}"
    assert cos >= min_cos, f"{quant}: logit cosine {cos:.4f}"


@pytest.mark.parametrize("arch", ["qwen2", "gemma2", "phi3"])
def test_quantized_models_generate(make_ckpt, arch: str) -> None:
    for quant in ("int8", "int4", "bf16"):
        g = LLM.from_pretrained(make_ckpt(arch), quant=quant, device="cpu").generate(
            "Hello", max_new_tokens=4, ignore_eos=True
        )
        assert len(g.token_ids) == 4
