"""Property tests of the f32 ``gemm`` step at the executor boundary, against ``torch.addmm``.

One ``gemm`` step is written as a plan by hand (no Dynamo, so hypothesis can draw hundreds of
cases): sizes around the kernels' tile and block edges (MR, NR, the few-rows / many-rows switch,
the matrix-vector path of 1-4 rows) including 0 and 1, every operand transposed or a strided
window of a larger tensor, alpha / beta, a broadcast bias, an activation epilogue, NaN and inf
in the operands, on 1 and 2 threads and on every GEMM backend."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native
from tb_cpu_rust.threads import use_torch_openmp

#: sizes at and around the edges of the own kernel's tiles (MR 6 / 12, NR 16 / 32), the
#: matrix-vector path (<= 4 rows), the few-rows loop (<= 256 rows) and a KC slice (256)
SIZES = st.one_of(
    st.integers(0, 40),
    st.sampled_from([47, 48, 63, 64, 65, 95, 96, 97, 130, 255, 256, 257, 300, 513]),
)

EPILOGUES = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu}


@pytest.fixture(scope="module", autouse=True)
def _openmp() -> None:
    use_torch_openmp()


@pytest.fixture(params=["auto", "gemm"], scope="module")
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The default backend (the own kernel on x86-64 with AVX2 or AVX-512) and faer's crate."""
    _native.set_gemm_backend(request.param)
    yield request.param
    _native.set_gemm_backend("auto")


def _layout(rows: int, cols: int, how: str, seed: int) -> torch.Tensor:
    """A rows x cols float32 operand: contiguous, transposed (column-major) or a window of every
    other row and column of a larger tensor."""
    g = torch.Generator().manual_seed(seed)
    if how == "t":
        return torch.randn(cols, rows, generator=g).t()
    if how == "window":
        return torch.randn(2 * rows + 1, 2 * cols + 2, generator=g)[1::2, 2::2]
    return torch.randn(rows, cols, generator=g)


def _desc(t: torch.Tensor, kind: str) -> dict[str, Any]:
    return {"kind": kind, "dtype": "float32", "numel": 0, "sizes": list(t.shape), "strides": list(t.stride())}


def _gemm_spec(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    alpha: float,
    beta: float,
    epilogue: list[str],
) -> str:
    """A plan of one ``gemm`` step: out = alpha * a @ b + beta * bias, then the epilogue."""
    m, n = out.shape
    ins = [a, b] + ([bias] if bias is not None else [])
    buffers = [_desc(t, "input") for t in ins] + [dict(_desc(out, "output"), numel=out.numel())]
    values = [{"buf": i, "offset": 0, "sizes": d["sizes"], "strides": d["strides"]} for i, d in enumerate(buffers)]
    bias_value = None
    if bias is not None:
        # the step takes its bias broadcast to the output's shape, as the lowering writes it
        bias_value = len(values)
        values.append({"buf": 2, "offset": 0, "sizes": [m, n], "strides": list(bias.expand(m, n).stride())})
    step = {
        "op": "gemm",
        "ins": [0, 1, bias_value, None],
        "outs": [len(ins)],
        "alpha": alpha,
        "beta": beta,
        "epilogue": epilogue,
    }
    return json.dumps({"schema": _native.STEP_SCHEMA_VERSION, "buffers": buffers, "values": values, "steps": [step]})


@settings(max_examples=150, deadline=None)
@given(
    m=SIZES,
    k=SIZES,
    n=SIZES,
    a_how=st.sampled_from(["c", "t", "window"]),
    b_how=st.sampled_from(["c", "t", "window"]),
    bias_shape=st.sampled_from(["none", "row", "column", "full"]),
    alpha=st.sampled_from([1.0, 0.5, -2.0]),
    beta=st.sampled_from([1.0, 0.5, -3.0]),
    epilogue=st.sampled_from([[], ["relu"], ["tanh"], ["sigmoid"], ["silu"]]),
    special=st.sampled_from([None, math.nan, math.inf, -math.inf]),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_gemm_step_matches_torch_addmm(
    backend: str,
    m: int,
    k: int,
    n: int,
    a_how: str,
    b_how: str,
    bias_shape: str,
    alpha: float,
    beta: float,
    epilogue: list[str],
    special: float | None,
    threads: int,
    seed: int,
) -> None:
    a = _layout(m, k, a_how, seed)
    b = _layout(k, n, b_how, seed + 1)
    if special is not None and m * k > 0:
        # one non-finite value in A: its row of the product is NaN or inf where torch's is
        a[seed % m, (seed // 7) % k] = special
    bias = {
        "none": None,
        "row": torch.randn(n, generator=torch.Generator().manual_seed(seed + 2)),
        "column": torch.randn(m, 1, generator=torch.Generator().manual_seed(seed + 2)),
        "full": torch.randn(m, n, generator=torch.Generator().manual_seed(seed + 2)),
    }[bias_shape]
    want = torch.mm(a, b) * alpha if bias is None else torch.addmm(bias, a, b, beta=beta, alpha=alpha)
    for e in epilogue:
        want = EPILOGUES[e](want)
    out = torch.full((m, n), 123.0)
    ex = _native.Executor(_gemm_spec(a, b, bias, out, alpha, beta if bias is not None else 0.0, epilogue))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ex.run([a, b] + ([bias] if bias is not None else []), [out])
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * max(1.0, k) ** 0.5, equal_nan=True)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("weight_t", [False, True])
def test_few_rows_products_read_b_in_either_layout(backend: str, rows: int, weight_t: bool) -> None:
    """The matrix-vector path (<= 4 rows) with B row-major (``x @ W``) and column-major
    (``x @ W.T``, a Linear's weight), a k that is no multiple of a vector and n past one task."""
    k, n = 83, 150
    a = torch.randn(rows, k)
    b = torch.randn(n, k).t() if weight_t else torch.randn(k, n)
    bias = torch.randn(n)
    out = torch.empty(rows, n)
    ex = _native.Executor(_gemm_spec(a, b, bias, out, 1.5, 1.0, ["relu"]))
    ex.run([a, b, bias], [out])
    torch.testing.assert_close(out, torch.relu(torch.addmm(bias, a, b, alpha=1.5)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 12, 13])
@pytest.mark.parametrize("m,k", [(5, 16), (64, 512), (9, 23), (2048, 100)])
@pytest.mark.parametrize("threads", [1, 2])
def test_linear_with_few_outputs_matches_torch_addmm(backend: str, n: int, m: int, k: int, threads: int) -> None:
    """``F.linear`` with at most 12 outputs (a classifier head: the dot-product path of the own
    backend; 13 takes the packing GEMM) against ``torch.addmm``: x rows padded (a window of a wider
    tensor), a bias and relu, a NaN and an inf in two rows of x, rows split over the threads."""
    g = torch.Generator().manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(m, k + 5, generator=g)[:, 2 : 2 + k]
    a[1, k // 2] = math.nan
    a[3, 0] = math.inf
    b = torch.randn(n, k, generator=g).t()
    bias = torch.randn(n, generator=g)
    out = torch.full((m, n), 123.0)
    ex = _native.Executor(_gemm_spec(a, b, bias, out, 1.0, 1.0, ["relu"]))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ex.run([a, b, bias], [out])
    finally:
        torch.set_num_threads(before)
    want = torch.relu(torch.addmm(bias, a, b))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * k**0.5, equal_nan=True)
