"""bfloat16 / float16 on native_cpu: the vectorised casts bit for bit against torch, the GEMM that
reads and writes bfloat16 itself (AMX tiles, the vdpbf16ps pair kernel, widened operands) against
eager in the same dtype, and the lowering that folds the low-precision pass's casts into it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native
from torchburn.testing import models
from torchburn.testing.conformance import compile_with

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DTYPE_NAMES = {"bfloat16": BF16, "float16": F16, "float32": F32}


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


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """bfloat16 tolerances (one rounding apart, float32 sums in another order), the absolute one
    scaled by the values' size."""
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = max(1.0, want.float().nan_to_num(0, 0, 0).abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2 * scale, equal_nan=True)


def specials(x: torch.Tensor) -> torch.Tensor:
    """``x`` with NaN, ±inf, ±0, a bfloat16 rounding tie and a float32 subnormal in its first elements."""
    flat = x.reshape(-1)
    vals = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.00390625, 1e-40, -3.0e38]
    flat[: min(len(vals), flat.numel())] = torch.tensor(vals[: flat.numel()], dtype=x.dtype)
    return x


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(0, 40),
    cols=st.integers(1, 70),
    transposed=st.booleans(),
    pair=st.sampled_from(
        [("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "float16"), ("float16", "float32")]
    ),
    seed=st.integers(0, 2**16),
)
def test_casts_match_torch_bit_for_bit(
    rows: int, cols: int, transposed: bool, pair: tuple[str, str], seed: int
) -> None:
    src, dst = DTYPE_NAMES[pair[0]], DTYPE_NAMES[pair[1]]
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, cols, generator=g) * 100).to(src)
    if x.numel():
        specials(x)
    if transposed:  # a dense non-contiguous layout, and a column slice (rows strided apart)
        x = x.t()
    got = compiled(lambda t: (t.to(dst), t[:, ::2].to(dst)))(x)
    for a, b in zip(got, (x.to(dst), x[:, ::2].to(dst)), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        nan = b.isnan()
        assert torch.equal(a.isnan(), nan)
        bits = torch.int16 if dst != F32 else torch.int32
        assert torch.equal(a.contiguous().view(bits)[~nan], b.contiguous().view(bits)[~nan])


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.sampled_from([1, 2, 4, 5, 8, 17, 33]),
    k=st.sampled_from([2, 31, 40, 64, 96, 130, 784]),
    n=st.sampled_from([1, 16, 45, 64]),
    a_t=st.booleans(),
    b_t=st.booleans(),
    dtype=st.sampled_from(["bfloat16", "float16"]),
    backend=st.sampled_from(["auto", "gemm"]),
)
def test_low_precision_gemm_matches_eager(
    m: int, k: int, n: int, a_t: bool, b_t: bool, dtype: str, backend: str
) -> None:
    """addmm in bfloat16 / float16 over shapes around the tile sizes (1-4 rows: the vdpbf16ps
    pair GEMV; more rows and k ≥ 32: AMX tiles, a k remainder past the multiple of 32 on
    vdpbf16ps; odd k: widened), transposed operands, and the widened path of another GEMM backend
    (the path CPUs without AVX-512 BF16 run)."""
    dt = DTYPE_NAMES[dtype]
    g = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    a = torch.randn(k, m, generator=g).to(dt).t() if a_t else torch.randn(m, k, generator=g).to(dt)
    b = torch.randn(n, k, generator=g).to(dt).t() if b_t else torch.randn(k, n, generator=g).to(dt)
    bias = torch.randn(n, generator=g).to(dt)
    fn = compiled(lambda a, b, bias: torch.relu(torch.addmm(bias, a, b)))
    _native.set_gemm_backend(backend)
    try:
        close(fn(a, b, bias), torch.relu(torch.addmm(bias, a, b)))
    finally:
        _native.set_gemm_backend("auto")


def _readme(mode: str, batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    model, (x,) = models.readme_mlp(batch=batch)
    if mode == "bf16":
        model, x = model.to(BF16), x.to(BF16)
    return model, x


def _call(fn: Any, x: torch.Tensor, mode: str) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16, enabled=mode == "autocast"):
        out: torch.Tensor = fn(x)
    return out


@pytest.mark.parametrize("mode", ["bf16", "autocast"])
@pytest.mark.parametrize("batch", [0, 1, 7, 32])
def test_readme_model_runs_natively_on_bf16_gemms(lowered: list[dict[str, Any]], mode: str, batch: int) -> None:
    """The README model in bfloat16 and under autocast: every op native (compile_with fails on a
    fallback), close to eager bfloat16, and the plan's GEMMs read the bfloat16 weights as they
    are (no float32 copy of any weight) and write bfloat16 (no float32 result)."""
    model, x = _readme(mode, batch)
    fn = compiled(model)
    out = _call(fn, x, mode)
    close(out, _call(model, x, mode))
    assert out.dtype == BF16
    if batch == 0:
        return
    (spec,) = lowered
    dtypes = [b["dtype"] for b in spec["buffers"]]
    val_dtype = [dtypes[v["buf"]] for v in spec["values"]]
    gemms = [s for s in spec["steps"] if s["op"] == "gemm"]
    assert len(gemms) == 2
    assert gemms[0]["epilogue"] == ["relu"]  # relu computed before the rounding, in the tile
    for s in gemms:
        assert all(val_dtype[v] == "bfloat16" for v in [*s["ins"], *s["outs"]] if v is not None), s
    casts = [s for s in spec["steps"] if s["op"] == "cast"]
    # bf16: nothing to cast; autocast: the float32 input and parameters rounded to bfloat16 once
    assert len(casts) == (0 if mode == "bf16" else 5)
    assert all(val_dtype[s["outs"][0]] == "bfloat16" for s in casts)
    # no float32 buffer holds anything (the widened copies and results the fold removed)
    assert all(b["numel"] == 0 for b in spec["buffers"] if b["dtype"] == "float32" and b["kind"] == "temp")


def test_non_contiguous_input_and_specials() -> None:
    model, _ = _readme("bf16", 1)
    big = torch.randn(9, 1024).to(BF16)
    x = specials(big[:, ::2])  # rows 1024 apart, every other column
    fn = compiled(model)
    close(_call(fn, x, "bf16"), _call(model, x, "bf16"))
    xt = torch.randn(512, 5).to(BF16).t()  # a transposed input: the GEMM reads it through strides
    close(_call(fn, xt, "bf16"), _call(model, xt, "bf16"))


def test_widened_path_of_another_backend_runs_the_readme_model() -> None:
    """The GEMM backend set to faer's crate: the bfloat16 operands are widened (the path an AVX2-only
    CPU runs), the result the same as eager's within bfloat16 tolerance."""
    model, x = _readme("bf16", 32)
    fn = compiled(model)
    want = _call(model, x, "bf16")
    _native.set_gemm_backend("gemm")
    try:
        close(_call(fn, x, "bf16"), want)
    finally:
        _native.set_gemm_backend("auto")


def test_empty_sum_after_a_full_one() -> None:
    """k = 0 after a GEMM of the same result size: the float32 result scratch is reused between
    calls, and an empty sum must still read as zeros (plus the bias), not the last call's values."""
    torch.manual_seed(5)
    bias = torch.randn(48).to(BF16)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, x, w)

    full = compiled(fn)
    x, w = torch.randn(32, 64).to(BF16), torch.randn(64, 48).to(BF16)
    with torch.no_grad():
        close(full(x, w), fn(x, w))
        empty = compiled(fn)
        x0, w0 = torch.randn(32, 0).to(BF16), torch.randn(0, 48).to(BF16)
        got = empty(x0, w0)
    assert torch.equal(got, fn(x0, w0))
    assert torch.equal(got, bias.expand(32, 48))


@pytest.mark.parametrize(("rows", "k", "n"), [(256, 256, 768), (256, 1024, 256), (37, 96, 100), (3, 64, 40)])
def test_conv1d_layout_on_bfloat16_pairs(rows: int, k: int, n: int) -> None:
    """GPT-2's ``Conv1D``: ``addmm(bias, x, W)`` with ``W`` k×n row-major (not a Linear's
    ``W.T``), then GELU (tanh). The weight's 32-column panels are packed in row pairs for the
    pair kernel (several column tasks at 256 rows, a partial last panel at n = 100 and 40, a
    k past one 256-pair slice at 1024); against eager bfloat16, and the float32 product of the
    same bfloat16 values within one bfloat16 rounding."""
    g = torch.Generator().manual_seed(rows + k + n)
    x = torch.randn(rows, k, generator=g).to(BF16)
    w = (torch.randn(k, n, generator=g) / k**0.5).to(BF16)
    bias = torch.randn(n, generator=g).to(BF16)

    def fn(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(torch.addmm(bias, x, w), approximate="tanh")

    with torch.no_grad():
        got = compiled(fn)(x, w, bias)
        close(got, fn(x, w, bias))
        exact = torch.addmm(bias.double(), x.double(), w.double())
        torch.testing.assert_close(
            got.double(), torch.nn.functional.gelu(exact, approximate="tanh"), atol=2e-2, rtol=1e-2
        )
