"""bfloat16 / float16 elementwise chains on native_cpu with the low-precision pass on: the fused
float32 programs read and write the low-precision buffers themselves (the pass's casts folded into
them, ``lowering.low_precision_ew``), and match eager in the same dtype bit for bit, since each op
computes in float32 and rounds once, as eager's kernels do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchburn.testing.conformance import compile_with

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The lowered spec of every partition compiled while the test runs."""
    from tb_cpu_rust import lower as lower_mod
    from tb_cpu_rust import program

    seen: list[dict[str, Any]] = []

    def record(plan: Any) -> dict[str, Any]:
        result = lower_mod.lower(plan)
        seen.append(result["spec"])
        return result

    monkeypatch.setattr(program, "lower", record)
    return seen


def compiled(fn: Any) -> Any:
    """``fn`` on native_cpu alone (an op falling back to eager fails), low-precision pass on."""
    return compile_with("native_cpu", fn, cache=False, low_precision=True)[0]


def specials(x: torch.Tensor) -> torch.Tensor:
    """``x`` with NaN, ±inf, ±0, a bfloat16 rounding tie and values near the top of the range first."""
    flat = x.reshape(-1)
    vals = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.00390625, 1e-40, -3.0e38, 3.0e38]
    flat[: min(len(vals), flat.numel())] = torch.tensor(vals[: flat.numel()], dtype=x.dtype)
    return x


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU written out, as transformers' NewGELUActivation does."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def affine_tanh(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * 0.5 + y) * x


def sigmoid_gate(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * y - x.abs()


def exact(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def step_dtypes(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    dtypes = [b["dtype"] for b in spec["buffers"]]
    return spec["steps"], [dtypes[v["buf"]] for v in spec["values"]]


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("shape", [(64, 33), (1, 1), (7,), (3, 5, 17), (0, 4)])
def test_chain_reads_and_writes_low_precision_without_casts(
    lowered: list[dict[str, Any]], dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    x = specials(torch.randn(shape).to(dtype))
    y = torch.randn(shape[-1:]).to(dtype)  # broadcast over the leading dims
    with torch.no_grad():
        exact(compiled(affine_tanh)(x, y), affine_tanh(x, y))
    if x.numel() == 0:
        return
    (spec,) = lowered
    steps, val_dtype = step_dtypes(spec)
    assert [s["op"] for s in steps if s["op"] == "cast"] == []  # every cast folded
    # the four ops are one program: the rounded intermediates stay in registers
    (ew,) = steps
    assert ew["op"] == "ew"
    rounding = "round_bf16" if dtype == BF16 else "round_f16"
    assert sum(i["op"] == rounding for i in ew["prog"]) == 3, ew["prog"]
    name = "bfloat16" if dtype == BF16 else "float16"
    for s in steps:
        assert all(val_dtype[v] == name for v in [*s["ins"], *s["outs"]]), s
    # no float32 buffer holds anything
    assert all(b["numel"] == 0 for b in spec["buffers"] if b["dtype"] == "float32" and b["kind"] == "temp")


def test_zero_dim_operands() -> None:
    """0-d bfloat16 values (a scalar tensor in a chain): their float32 temporaries keep one element."""
    x = torch.tensor(1.5).to(BF16)
    y = torch.randn(5, 3).to(BF16)
    fn = compiled(lambda a, b: ((a * 3.0) * a, (b * a) - b))
    with torch.no_grad():
        got, want = fn(x, y), ((x * 3.0) * x, (y * x) - y)
    exact(got[0], want[0])
    exact(got[1], want[1])


@pytest.mark.parametrize("fn", [gelu_tanh, lambda x: sigmoid_gate(x, x.flip(0))], ids=["gelu_tanh", "sigmoid_gate"])
def test_activation_chains_match_eager(fn: Callable[..., torch.Tensor]) -> None:
    """Transcendentals: native_cpu's float32 tanh / sigmoid / pow differ from PyTorch's in the last
    float32 bits, which moves a bfloat16 rounding now and then (as before the fold): bfloat16
    tolerances, and the rounded intermediates still bit for bit where no transcendental is involved
    (the other tests)."""
    torch.manual_seed(1)
    x = specials(torch.randn(128, 96).to(BF16) * 4)
    with torch.no_grad():
        got, want = compiled(fn)(x), fn(x)
    assert got.dtype == want.dtype == BF16
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=2e-2, equal_nan=True)


def test_non_contiguous_and_broadcast_operands() -> None:
    torch.manual_seed(2)
    base = torch.randn(24, 40).to(BF16)
    x = specials(base[::2, 1::3])  # rows and columns strided, odd sizes
    xt = torch.randn(x.shape[1], x.shape[0]).to(BF16).t()  # a transposed operand
    y = torch.randn(1, x.shape[1]).to(BF16)
    fn = compiled(lambda a, b, c: (a * c + b) * a - b)
    with torch.no_grad():
        exact(fn(x, y, xt), (x * xt + y) * x - y)


def test_mixed_float32_and_bfloat16_operands() -> None:
    """A float32 operand beside bfloat16 ones: the float32 one is read as it is, the result is
    float32 as in eager (type promotion), nothing rounded where eager does not round."""
    torch.manual_seed(3)
    x = torch.randn(33, 9).to(BF16)
    w = torch.randn(9)
    fn = compiled(lambda a, b: torch.tanh(a) * b + a)
    with torch.no_grad():
        got, want = fn(x, w), torch.tanh(x) * w + x
    assert got.dtype == want.dtype == F32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_result_read_twice_keeps_its_rounding(lowered: list[dict[str, Any]]) -> None:
    """A rounded intermediate read by two ops and returned: the ew step writes it in bfloat16 and
    both readers read that rounded value."""
    torch.manual_seed(4)
    x = torch.randn(16, 31).to(BF16)

    def fn(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = a * 1.7 - a.abs()
        return h, h * h - h

    with torch.no_grad():
        got, want = compiled(fn)(x), fn(x)
    exact(got[0], want[0])
    exact(got[1], want[1])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 70),
    step=st.integers(1, 3),
    transpose=st.booleans(),
    dtype=st.sampled_from([BF16, F16]),
)
def test_hypothesis_chains_match_eager(rows: int, cols: int, step: int, transpose: bool, dtype: torch.dtype) -> None:
    x = (torch.randn(rows, cols * step) * 3).to(dtype)[:, ::step]
    if transpose:
        x = x.t()
    y = torch.randn(x.shape[-1]).to(dtype)
    torch._dynamo.reset()
    with torch.no_grad():
        exact(compiled(affine_tanh)(x, y), affine_tanh(x, y))
