"""Load-time quantization in Rust (``llm_quantize``) against tb-core's Python quantizer
(``torchburn.llm.quantize``, the numbers of the weight formats), bit for bit, and the embedding
lookup that reads rows of the packed weight (``LLMWeight.rows``)."""

from __future__ import annotations

import pytest
import torch

from tb_cpu_rust import _native
from tb_cpu_rust.llm import NativeLLMBackend, _arg
from torchburn.llm import quantize

BE = NativeLLMBackend()


def _weight(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    w = torch.randn(n, k) * 0.02
    w[0, :32] = 0.25  # a constant group: the int4 scale clamps to 2**-24 (float16's smallest)
    if n > 2:
        w[2] = 0.0  # an all-zero row: the int8 scale clamps too
        w[1, 5] = 3.0  # an outlier
        w[1, 32:64] *= 1e-4  # an int4 scale among float16's subnormals
        w[1, 64:96] += 300.0  # an int4 zero whose float16 rounding is coarse next to the scale
    # exact halves of the step, where round-half-to-even matters
    w[-1, :8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 127.0, 0.0, 1.0]) * 0.01
    return w.to(dtype)


def _rust_layout(w: torch.Tensor, kind: str, group: int) -> tuple[torch.Tensor, ...]:
    n, k = w.shape
    if kind == "int8":
        q, s = torch.empty(n, k, dtype=torch.int8), torch.empty(n)
        _native.llm_quantize_layout(_arg(w), kind, group, _arg(q), _arg(s))
        return q, s
    q, s, z = torch.empty(n, k // 2, dtype=torch.uint8), torch.empty(n, k // group), torch.empty(n, k // group)
    _native.llm_quantize_layout(_arg(w), kind, group, _arg(q), _arg(s), _arg(z))
    return q, s, z


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(1, 32), (5, 96), (33, 896), (17, 4864)])
def test_int8_bit_identical_to_python(dtype: torch.dtype, n: int, k: int) -> None:
    w = _weight(n, k, dtype, n * k)
    py = quantize(w, "int8")
    q, s = _rust_layout(w, "int8", 32)
    assert torch.equal(q, py.qweight) and torch.equal(s, py.scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize(("n", "k"), [(1, 128), (7, 384), (33, 896), (9, 4864)])
def test_int4_bit_identical_to_python(dtype: torch.dtype, group: int, n: int, k: int) -> None:
    w = _weight(n, k, dtype, n + k + group)
    py = quantize(w, "int4", group)
    q, s, z = _rust_layout(w, "int4", group)
    assert torch.equal(q, py.qweight) and torch.equal(s, py.scales) and torch.equal(z, py.zeros)


def test_int4_scales_and_zeros_are_float16_values() -> None:
    w = _weight(33, 896, torch.float32, 5)
    py = quantize(w, "int4", 32)
    for t in (py.scales, py.zeros):
        assert torch.equal(t.half().float(), t)
    assert bool((py.scales > 0).all())
    # the codes are taken against the rounded scale and zero: within half a step, plus what
    # float16 takes off the zero (half a unit in its last place, |z| * 2**-11 at most), which
    # matters only for a group far from 0 next to its spread (the +300 group, as in GGUF Q4_1)
    err = (py.dequantize() - w).abs().reshape(33, -1, 32)
    bound = py.scales * 0.51 + py.zeros.abs() * 2.0**-11 + 1e-6
    assert bool((err <= bound.unsqueeze(-1)).all())
    assert float(err[1, 2].max()) > 0.6 * float(py.scales[1, 2])  # the +300 group: the zero's rounding shows
    # a scale among float16's subnormals (coarse steps of 2**-24) still resolves the group
    assert 0 < float(py.scales[1, 1]) < 2.0**-14
    assert float(err[1, 1].max()) < 0.1 * float(w[1, 32:64].abs().max())


def test_int4_beyond_float16_range_is_an_error_in_both_quantizers() -> None:
    w = torch.randn(4, 64)
    w[2, 40] = 1e6
    with pytest.raises(ValueError, match=r"1 row\(s\).*beyond float16"):
        quantize(w, "int4", 32)
    with pytest.raises(ValueError, match=r"1 row\(s\).*beyond float16"):
        _rust_layout(w, "int4", 32)
    with pytest.raises(ValueError, match="beyond float16"):
        _native.llm_quantize(_arg(w), "int4", 32)


def test_int4_packing_rejects_scales_that_are_not_float16() -> None:
    qw = quantize(torch.randn(4, 64), "int4", 32)
    assert BE.prepare_linear(qw) is not None
    bad = qw.scales.clone()
    bad[3, 1] = 0.01  # not a float16 value: packing it as float16 would change the weight
    with pytest.raises(ValueError, match=r"scales\[3, 1\] = 1e-2 is not a float16 value"):
        _native.llm_pack_int4(_arg(qw.qweight), _arg(bad), _arg(qw.zeros), 32)
    bad_z = qw.zeros.clone()
    bad_z[0, 0] = 1.0 / 3.0
    with pytest.raises(ValueError, match=r"zeros\[0, 0\].*not a float16 value"):
        _native.llm_pack_int4(_arg(qw.qweight), _arg(qw.scales), _arg(bad_z), 32)


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weight_from_rust_equals_python_path(quant: str, dtype: torch.dtype) -> None:
    """The one-pass ``quantize_linear`` handle holds exactly ``prepare_linear(quantize(...))``'s
    weight: every row dequantizes to the same bits, and both give the same products."""
    w = _weight(300, 896, dtype, 3)
    fast = BE.quantize_linear(w, quant, 32)
    slow = BE.prepare_linear(quantize(w, quant, 32))
    assert fast is not None and fast.kind == slow.kind == quant and fast.nbytes == slow.nbytes
    ids = torch.arange(300)
    a, b = torch.empty(300, 896), torch.empty(300, 896)
    fast.rows(_arg(ids), _arg(a))
    slow.rows(_arg(ids), _arg(b))
    assert torch.equal(a, b)
    x = torch.randn(3, 896)
    assert torch.equal(BE.linear(x, fast, None), BE.linear(x, slow, None))


def test_quantize_linear_declines_what_it_does_not_do() -> None:
    w = torch.randn(8, 64)
    assert BE.quantize_linear(w, "bf16", 32) is None
    assert BE.quantize_linear(w.half(), "int8", 32) is None
    assert BE.quantize_linear(torch.randn(8, 96), "int4", 48) is None  # torchburn.llm.quantize raises its own error
    # K not a multiple of the group: int8, as torchburn.llm.quantize stores it
    odd = BE.quantize_linear(torch.randn(8, 48), "int4", 32)
    assert odd is not None and odd.kind == "int8"


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8", "int4"])
def test_embedding_rows_match_quantweight_rows(kind: str) -> None:
    torch.manual_seed(1)
    qw = quantize(torch.randn(50, 256), kind, 64)
    table = BE.embedding_table(BE.prepare_linear(qw))
    ids = torch.tensor([[3, 0, 49], [7, 7, 1]])
    assert table is not None and table.kind == kind
    got = table.rows(ids, torch.float32)
    assert got.shape == (2, 3, 256)
    assert torch.equal(got, qw.rows(ids, torch.float32))
    # no embedding kernel of its own (tb-llm's reference reads table.rows): the packed rows are it
    assert not hasattr(BE, "embedding")


def test_rows_rejects_bad_ids() -> None:
    w = BE.prepare_linear(quantize(torch.randn(4, 32), "int8"))
    out = torch.empty(1, 32)
    for bad in (4, -1):
        with pytest.raises(ValueError, match="out of range"):
            w.rows(_arg(torch.tensor([bad])), _arg(out))
    with pytest.raises(ValueError):
        w.rows(_arg(torch.tensor([0, 1])), _arg(out))


def test_bad_quantize_arguments_raise() -> None:
    w = torch.randn(4, 64)
    with pytest.raises(ValueError, match="int8 or int4"):
        _native.llm_quantize(_arg(w), "int3", 32)
    with pytest.raises(ValueError, match="group size"):
        _native.llm_quantize(_arg(w), "int4", 48)
    with pytest.raises(ValueError, match="dtype"):
        _native.llm_quantize(_arg(w.half()), "int8", 32)
