"""More kernels against PyTorch: dense linear algebra (LU, solves, determinants, Cholesky,
triangular solves) and copies / fills into the storage-only dtypes (float64, float16, bfloat16,
int32, int16, int8, uint8)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from native_helpers import run_native as _run_native

from tb_cpu_rust import _native
from torchburn.testing.conformance import compile_with


def _well_conditioned(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    return torch.randn(*shape, generator=g) + n * torch.eye(n) * 0.5


def _spd(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*shape, generator=g)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def _close(got: Any, want: Any, **kw: Any) -> None:
    kw.setdefault("rtol", 1e-4)
    kw.setdefault("atol", 1e-5)
    torch.testing.assert_close(got, want, **kw)


# -- linear algebra -----------------------------------------------------------------------------

SQUARE = [(1, 1), (3, 3), (5, 5), (2, 4, 4), (2, 3, 3, 3), (0, 3, 3), (0, 0)]


@pytest.mark.parametrize("shape", SQUARE)
@pytest.mark.parametrize("transposed", [False, True])
def test_lu_factor_and_unpack_match_torch(shape: tuple[int, ...], transposed: bool) -> None:
    a = _well_conditioned(*shape)
    a = a.mT if transposed else a  # a non-contiguous input

    def fn(x: torch.Tensor) -> Any:
        lu, piv = torch.linalg.lu_factor(x)
        return lu, piv, torch.lu_unpack(lu, piv)

    got, want = _run_native(fn, a), fn(a)
    _close(got, want)


@pytest.mark.parametrize("shape", [(4, 6), (6, 4), (2, 3, 5), (3, 3)])
def test_rectangular_lu_matches_torch(shape: tuple[int, ...]) -> None:
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    _close(_run_native(torch.linalg.lu, a), torch.linalg.lu(a))
    _close(_run_native(torch.linalg.lu_factor_ex, a), torch.linalg.lu_factor_ex(a))


def test_lu_pivots_pick_the_first_largest_entry() -> None:
    # ties in |value|: LAPACK takes the first row, so must we
    a = torch.tensor([[1.0, 2.0, 0.0], [-3.0, 1.0, 1.0], [3.0, 0.0, 2.0]])
    got = _run_native(torch.linalg.lu_factor, a)
    want = torch.linalg.lu_factor(a)
    assert torch.equal(got[1], want[1])
    _close(got[0], want[0])


def test_singular_matrix_info_and_det() -> None:
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    got = _run_native(torch.linalg.lu_factor_ex, a)
    want = torch.linalg.lu_factor_ex(a)
    assert got.info.item() == want.info.item() == 2
    _close(_run_native(torch.linalg.det, a), torch.linalg.det(a))
    _close(_run_native(torch.linalg.slogdet, a), torch.linalg.slogdet(a))


@pytest.mark.parametrize("shape", SQUARE)
def test_det_slogdet_logdet_inv_match_torch(shape: tuple[int, ...]) -> None:
    a = _well_conditioned(*shape, seed=2)
    for fn in (torch.linalg.det, torch.linalg.slogdet, torch.linalg.inv, torch.linalg.inv_ex, torch.logdet):
        x = a @ a.mT if fn is torch.logdet else a
        _close(_run_native(fn, x), fn(x), equal_nan=True)


_SOLVE_SHAPES = [
    ((3, 3), (3, 2)),
    ((3, 3), (3,)),
    ((2, 4, 4), (4, 1)),
    ((4, 4), (2, 4, 3)),
    ((2, 3, 3), (2, 3)),
    ((0, 2, 2), (2, 1)),
]


# left=False takes the right-hand side as rows, so only matrix right-hand sides have that form.
@pytest.mark.parametrize(
    ("a_shape", "b_shape", "left"),
    [(a, b, True) for a, b in _SOLVE_SHAPES]
    + [(a, b, False) for a, b in _SOLVE_SHAPES if len(b) != 1 and len(b) != len(a) - 1],
)
def test_solve_matches_torch(a_shape: tuple[int, ...], b_shape: tuple[int, ...], left: bool) -> None:
    a = _well_conditioned(*a_shape, seed=3)
    b = torch.randn(*b_shape, generator=torch.Generator().manual_seed(4))
    if not left:
        b = b.mT.contiguous()

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return torch.linalg.solve(x, y, left=left), torch.linalg.solve_ex(x.mT, y, left=left)

    _close(_run_native(fn, a, b), fn(a, b))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve_matches_torch(left: bool, adjoint: bool) -> None:
    a = _well_conditioned(2, 4, 4, seed=5)
    b = torch.randn(2, 4, 3) if left else torch.randn(2, 3, 4)
    lu, piv = torch.linalg.lu_factor(a)

    def fn(lu: torch.Tensor, piv: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint)

    _close(_run_native(fn, lu, piv, b), fn(lu, piv, b))


def test_bad_pivots_raise_and_never_crash() -> None:
    lu, _ = torch.linalg.lu_factor(_well_conditioned(3, 3))
    bad = torch.tensor([7, 1, 1], dtype=torch.int32)
    compiled, _ = compile_with("native_cpu", lambda lu, p, b: torch.linalg.lu_solve(lu, p, b), cache=False)
    with pytest.raises(Exception, match="pivot"):
        compiled(lu, bad, torch.randn(3, 1))
    # the same with a bad spec handed to the executor directly
    spec = {
        "buffers": [
            {"kind": "input", "dtype": "float32", "numel": 0, "sizes": [3, 3], "strides": [3, 1]},
            {"kind": "output", "dtype": "int32", "numel": 3},
        ],
        "values": [
            {"buf": 0, "offset": 0, "sizes": [3, 3], "strides": [3, 1]},
            {"buf": 1, "offset": 0, "sizes": [3], "strides": [1]},
        ],
        "steps": [{"op": "lu_factor", "ins": [0], "outs": [1]}],
    }
    with pytest.raises(ValueError):
        _native.Executor(json.dumps(spec))
    spec["steps"] = [{"op": "cholesky", "ins": [1], "outs": [0]}]
    with pytest.raises(ValueError):
        _native.Executor(json.dumps(spec))


@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (2, 5, 5), (0, 3, 3)])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_family_matches_torch(shape: tuple[int, ...], upper: bool) -> None:
    a = _spd(*shape, seed=6)
    b = torch.randn(*shape[:-1], 2, generator=torch.Generator().manual_seed(7))

    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        f = torch.linalg.cholesky(a, upper=upper)
        return f, torch.cholesky_solve(b, f, upper=upper), torch.cholesky_inverse(f, upper=upper)

    _close(_run_native(fn, a, b), fn(a, b))


def test_cholesky_of_a_non_positive_definite_matrix() -> None:
    a = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    got = _run_native(torch.linalg.cholesky_ex, a)
    assert got.info.item() == torch.linalg.cholesky_ex(a).info.item() == 2
    compiled, _ = compile_with("native_cpu", torch.linalg.cholesky, cache=False)
    with pytest.raises(Exception, match="positive-definite"):
        compiled(a)


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_triangular_solves_match_torch(upper: bool, left: bool, unit: bool) -> None:
    a = _well_conditioned(2, 4, 4, seed=8)
    b = torch.randn(2, 4, 3) if left else torch.randn(2, 3, 4)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit)

    _close(_run_native(fn, a, b), fn(a, b))
    if left:

        def old(a: torch.Tensor, b: torch.Tensor) -> Any:
            return torch.triangular_solve(b, a, upper=upper, transpose=unit, unitriangular=unit)

        _close(_run_native(old, a[0], b), old(a[0], b))


# -- storage-only dtypes ------------------------------------------------------------------------

WIDE = [torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.int8, torch.uint8]


def _specials() -> torch.Tensor:
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(9)) * 50
    x[0, :6] = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.7, 65519.0])
    x[1, :4] = torch.tensor([1.0 + 2**-11, 1.0 + 3 * 2**-11, 3.0e-8, -1e-40])
    return x


@pytest.mark.parametrize("dtype", WIDE)
def test_casts_round_like_torch(dtype: torch.dtype) -> None:
    x = _specials()
    for inp in (x, x.t(), x[:, ::2]):
        got = _run_native(lambda t: t.to(dtype), inp)
        assert got.dtype == dtype
        torch.testing.assert_close(got, inp.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_float_casts_keep_nan_and_inf(dtype: torch.dtype) -> None:
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 1e30])
    torch.testing.assert_close(_run_native(lambda t: t.to(dtype), x), x.to(dtype), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", WIDE)
def test_fills_and_arange_in_wide_dtypes(dtype: torch.dtype) -> None:
    x = torch.randn(3, 4)

    def fn(t: torch.Tensor) -> Any:
        return (
            t.new_full((2, 3), 7, dtype=dtype),
            torch.full_like(t, 3, dtype=dtype),
            torch.zeros_like(t, dtype=dtype),
            torch.arange(1, 9, 2, dtype=dtype),
            t + 1,
        )

    _close(_run_native(fn, x), fn(x), rtol=0, atol=0)


def test_float64_fill_is_exact_and_handles_infinity() -> None:
    x = torch.randn(2)

    def fn(t: torch.Tensor) -> Any:
        return (
            torch.full((3,), 0.1, dtype=torch.float64),
            torch.full((2,), float("inf"), dtype=torch.float64),
            torch.full((2,), float("nan"), dtype=torch.float64),
            torch.full((2,), 2**40 + 1, dtype=torch.int64),
            t * 2,
        )

    _close(_run_native(fn, x), fn(x), rtol=0, atol=0, equal_nan=True)


def test_round_trip_and_empty() -> None:
    for shape in [(0,), (3, 0), ()]:
        x = torch.randn(shape)
        _close(_run_native(lambda t: t.double().float() * 2, x), x * 2)
    x = torch.randn(4, 3)
    _close(_run_native(lambda t: t.half().float() + 1, x), x.half().float() + 1)


def test_gather_with_int32_index() -> None:
    x = torch.randn(4, 5)
    idx = torch.tensor([[0, 4, 3], [2, 2, 1]], dtype=torch.int32)
    _close(_run_native(lambda x, i: torch.gather(x, 1, i), x, idx), torch.gather(x, 1, idx.long()))
    bad = torch.tensor([[9]], dtype=torch.int32)
    compiled, _ = compile_with("native_cpu", lambda x, i: torch.gather(x, 1, i), cache=False)
    with pytest.raises(Exception, match="out of bounds"):
        compiled(x, bad)


def test_wide_dtype_transcendentals_stay_eager() -> None:
    import torchburn

    explanation = torchburn.explain(
        lambda a: (a.double() * 3).exp(),
        torch.randn(3),
        options={"engine": "native_cpu", "min_partition_size": 1},
    )
    # single float64 arithmetic runs natively (wide_math.rs ew64); exp in float64 does not
    assert "aten.exp.default" in explanation.fallback_reasons
    assert "aten.mul.Tensor" not in explanation.fallback_reasons


def test_cast_spec_with_mismatched_shapes_is_an_error() -> None:
    spec = {
        "buffers": [
            {"kind": "input", "dtype": "float32", "numel": 0, "sizes": [3], "strides": [1]},
            {"kind": "output", "dtype": "float16", "numel": 4},
        ],
        "values": [
            {"buf": 0, "offset": 0, "sizes": [3], "strides": [1]},
            {"buf": 1, "offset": 0, "sizes": [4], "strides": [1]},
        ],
        "steps": [{"op": "cast", "ins": [0], "outs": [1]}],
    }
    with pytest.raises(ValueError):
        _native.Executor(json.dumps(spec))
    spec["values"][1]["sizes"] = [3]
    spec["buffers"][0]["dtype"] = "int64"
    spec["steps"] = [
        {
            "op": "ew",
            "compute": "i64",
            "ins": [0],
            "outs": [1],
            "prog": [{"op": "load", "dst": 0, "a": [0]}, {"op": "store", "dst": 0, "a": [0]}],
        }
    ]
    # float16 / bfloat16 operands are storage of float32 programs only
    with pytest.raises(ValueError):
        _native.Executor(json.dumps(spec))


# -- search, distances, order statistics --------------------------------------------------------


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_and_bucketize_match_torch(right: bool) -> None:
    g = torch.Generator().manual_seed(10)
    seq = torch.sort(torch.randn(3, 9, generator=g), dim=-1).values
    seq[0, 2:5] = seq[0, 2]  # repeated boundaries
    vals = torch.randn(3, 6, generator=g)
    vals[0, :2] = seq[0, 2]
    vals[1, 0] = float("nan")
    one = seq[1].contiguous()
    cases: list[tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = [
        (lambda s, v: torch.searchsorted(s, v, right=right), (seq, vals)),
        (lambda s, v: torch.searchsorted(s, v, right=right, out_int32=True), (one, vals.t())),
        (lambda s, v: torch.bucketize(v, s, right=right), (one, vals[:, ::2])),
        (lambda s, v: torch.bucketize(v, s, right=right), (one, vals[0, 0])),
        (lambda s, v: torch.searchsorted(s, v, right=right), (one[:0], vals)),
    ]
    for fn, args in cases:
        torch.testing.assert_close(_run_native(fn, *args), fn(*args), rtol=0, atol=0)


@pytest.mark.parametrize(("bins", "lo", "hi"), [(10, 0, 0), (7, -1, 1), (1, -3, 3), (5, 2, 2)])
def test_histc_matches_torch(bins: int, lo: float, hi: float) -> None:
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(11))
    x[0, 0] = 1.0  # exactly on the upper edge
    for inp in (x, x.t(), torch.zeros(0), torch.full((3,), 2.0)):
        fn = lambda t: torch.histc(t, bins=bins, min=lo, max=hi)  # noqa: E731
        torch.testing.assert_close(_run_native(fn, inp), fn(inp), rtol=0, atol=0)


def test_frexp_matches_torch() -> None:
    x = torch.tensor([0.0, -0.0, 1.0, -3.0, 1e-40, 3.4e38, 0.1, float("inf"), 1e-3])
    got, want = _run_native(torch.frexp, x), torch.frexp(x)
    torch.testing.assert_close(got.mantissa[:7], want.mantissa[:7], rtol=0, atol=0)
    torch.testing.assert_close(got.exponent[:7], want.exponent[:7], rtol=0, atol=0)
    torch.testing.assert_close(_run_native(torch.frexp, x.view(3, 3).t()), torch.frexp(x.view(3, 3).t()))


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.5, float("inf")])
def test_distances_match_torch(p: float) -> None:
    g = torch.Generator().manual_seed(12)
    x1, x2 = torch.randn(2, 4, 3, generator=g), torch.randn(5, 3, generator=g)
    x1[0, 0, 0] = x2[0, 0]  # a zero difference
    fns: list[tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = [
        (lambda a, b: torch.cdist(a, b, p=p), (x1, x2)),
        (lambda a, b: torch.cdist(a, b, p=p), (x1[0].t().contiguous().t(), x2[:0])),
        (lambda a: torch.nn.functional.pdist(a, p=p), (x2,)),
        (lambda a, b: torch.dist(a, b, p=p), (x1, x2[:4])),
    ]
    for fn, args in fns:
        _close(_run_native(fn, *args), fn(*args))


@pytest.mark.parametrize("op", [torch.median, torch.nanmedian, torch.mode])
@pytest.mark.parametrize("keepdim", [False, True])
def test_median_and_mode_along_a_dim_match_torch(op: Callable[..., Any], keepdim: bool) -> None:
    g = torch.Generator().manual_seed(13)
    x = torch.randint(0, 4, (4, 7), generator=g).float()  # many ties
    y = torch.randn(3, 5, generator=g)
    y[0, 1] = y[1, 3] = float("nan")
    y[2, :4] = float("nan")
    inputs = [x, x.t(), torch.tensor(2.5)] + ([y] if op is not torch.mode else [])
    for inp in inputs:
        for dim in range(-1, max(inp.dim(), 1)):
            fn = lambda t, dim=dim: op(t, dim, keepdim=keepdim)  # noqa: E731
            torch.testing.assert_close(_run_native(fn, inp), fn(inp), equal_nan=True)


def test_full_nanmedian_matches_torch() -> None:
    x = torch.randn(4, 5)
    x[1, 2] = float("nan")
    for inp in (x, x.t(), torch.full((1,), float("nan"))):
        torch.testing.assert_close(_run_native(torch.nanmedian, inp), torch.nanmedian(inp), equal_nan=True)


def test_nanmedian_index_of_a_row_of_nan_is_left_to_eager() -> None:
    x = torch.full((2, 5), float("nan"))
    compiled, _ = compile_with("native_cpu", lambda t: torch.nanmedian(t, 1), cache=False)
    # the native run refuses (strict here; with the default fallback eager answers instead)
    with pytest.raises(ValueError, match="eager decides"):
        compiled(x)


# -- resampling ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("kw", [{"size": (7, 3)}, {"scale_factor": 1.7}, {"size": (1, 1)}, {"scale_factor": 0.5}])
def test_upsample_2d_matches_torch(mode: str, align: bool, kw: dict[str, Any]) -> None:
    x = torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(14))
    fn = lambda t: torch.nn.functional.interpolate(t, mode=mode, align_corners=align, **kw)  # noqa: E731
    for inp in (x, x.transpose(2, 3)):
        _close(_run_native(fn, inp), fn(inp))


@pytest.mark.parametrize("align", [False, True])
def test_trilinear_matches_torch(align: bool) -> None:
    x = torch.randn(1, 2, 3, 4, 5)
    for kw in ({"size": (5, 2, 7)}, {"scale_factor": 2.0}):
        fn = lambda t: torch.nn.functional.interpolate(t, mode="trilinear", align_corners=align, **kw)  # noqa: E731, B023
        _close(_run_native(fn, x), fn(x))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_matches_torch(mode: str, padding: str, align: bool) -> None:
    g = torch.Generator().manual_seed(15)
    x = torch.randn(2, 3, 5, 6, generator=g)
    grid = torch.rand(2, 4, 7, 2, generator=g) * 2.6 - 1.3  # some points outside [-1, 1]
    fn = lambda a, b: torch.nn.functional.grid_sample(a, b, mode=mode, padding_mode=padding, align_corners=align)  # noqa: E731
    _close(_run_native(fn, x, grid), fn(x, grid))


# -- scatter-like copies and batched products ---------------------------------------------------


def test_masked_scatter_put_and_as_strided_match_torch() -> None:
    g = torch.Generator().manual_seed(16)
    x = torch.randn(4, 5, generator=g)
    mask = torch.rand(5, generator=g) > 0.4
    src = torch.randn(30, generator=g)
    fn = lambda a, m, s: a.masked_scatter(m, s)  # noqa: E731
    torch.testing.assert_close(_run_native(fn, x.t(), mask[:4], src), fn(x.t(), mask[:4], src))
    idx = torch.tensor([[0, -1], [7, 3]])
    for acc in (False, True):
        put = lambda a, i, s: torch.put(a, i, s, accumulate=acc)  # noqa: E731, B023
        torch.testing.assert_close(_run_native(put, x, idx, src[:4].view(2, 2)), put(x, idx, src[:4].view(2, 2)))
    strided = lambda a: torch.as_strided_copy(a, (3, 3), (1, 2))  # noqa: E731
    torch.testing.assert_close(_run_native(strided, x), strided(x))
    scat = lambda a, s: torch.as_strided_scatter(a, s, (2, 2), (1, 2))  # noqa: E731
    torch.testing.assert_close(_run_native(scat, x, src[:4].view(2, 2)), scat(x, src[:4].view(2, 2)))


def test_masked_scatter_with_too_little_source_raises() -> None:
    compiled, _ = compile_with("native_cpu", lambda a, m, s: a.masked_scatter(m, s), cache=False)
    with pytest.raises(Exception, match="source"):
        compiled(torch.randn(4), torch.ones(4, dtype=torch.bool), torch.randn(2))


@pytest.mark.parametrize(("beta", "alpha"), [(1.0, 1.0), (0.5, -2.0), (0.0, 1.0)])
def test_addbmm_matches_torch(beta: float, alpha: float) -> None:
    g = torch.Generator().manual_seed(17)
    m, b1, b2 = torch.randn(3, 5, generator=g), torch.randn(4, 3, 6, generator=g), torch.randn(4, 6, 5, generator=g)
    fn = lambda m, a, b: torch.addbmm(m, a, b, beta=beta, alpha=alpha)  # noqa: E731
    _close(_run_native(fn, m, b1, b2), fn(m, b1, b2))
    _close(_run_native(fn, m[:1], b1.transpose(1, 2).contiguous().transpose(1, 2), b2), fn(m[:1], b1, b2))


def test_linalg_check_errors_runs_native_and_raises_on_singular_input() -> None:
    a = _well_conditioned(3, 3)
    _close(_run_native(torch.linalg.inv, a), torch.linalg.inv(a))
    compiled, _ = compile_with("native_cpu", torch.linalg.inv, cache=False)
    with pytest.raises(Exception):  # noqa: B017 - eager's LinAlgError or ours
        compiled(torch.zeros(3, 3))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
@pytest.mark.parametrize("by", ["lengths", "offsets"])
def test_segment_reduce_matches_torch(reduce: str, initial: float | None, by: str) -> None:
    g = torch.Generator().manual_seed(18)
    data = torch.randn(3, 7, 2, generator=g)
    data[0, 1, 0] = float("nan")
    lengths = torch.tensor([[2, 0, 5], [1, 3, 3], [7, 0, 0]])
    bounds = lengths if by == "lengths" else torch.cat([torch.zeros(3, 1, dtype=torch.long), lengths.cumsum(1)], 1)

    def fn(d: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(d, reduce, axis=1, initial=initial, **{by: b})  # type: ignore[arg-type]

    torch.testing.assert_close(_run_native(fn, data, bounds), fn(data, bounds), equal_nan=True)


def test_segment_lengths_that_do_not_cover_the_axis_raise() -> None:
    compiled, _ = compile_with("native_cpu", lambda d, n: torch.segment_reduce(d, "sum", lengths=n), cache=False)
    with pytest.raises(Exception):  # noqa: B017 - ours or eager's message
        compiled(torch.randn(5), torch.tensor([1, 2]))


@pytest.mark.parametrize(
    ("shape", "channels_last"),
    [
        ((2, 3, 8, 9), False),
        ((3, 7, 6), False),
        ((16, 32, 32, 32), False),
        ((1, 1, 2, 2), False),
        ((4, 8, 10, 12), True),
    ],
)
@pytest.mark.parametrize("window", [(3, 2, 1), (2, 2, 0), (2, 1, 0)])  # kernel, stride, padding
def test_max_pool2d_backward_matches_torch(
    shape: tuple[int, ...], channels_last: bool, window: tuple[int, int, int]
) -> None:
    """Overlapping windows add several gradients into one input; 16 x 32 planes run on threads."""
    k, st, pad = window
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + k))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y, idx = torch.nn.functional.max_pool2d(x, k, stride=st, padding=pad, return_indices=True)
    gy = torch.randn_like(y)

    def fn(g: torch.Tensor, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.max_pool2d_with_indices_backward(g, x, [k, k], [st, st], [pad, pad], [1, 1], False, i)

    _close(_run_native(fn, gy, x, idx), fn(gy, x, idx))


def test_max_pool2d_backward_rejects_an_index_outside_the_plane() -> None:
    x = torch.randn(2, 3, 8, 8)
    y, idx = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
    idx[1, 2, 3, 3] = 64

    def fn(g: torch.Tensor, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, i)

    with pytest.raises(Exception, match="outside"):
        _run_native(fn, torch.ones_like(y), x, idx)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_3d_matches_torch(mode: str, padding: str, align: bool) -> None:
    g = torch.Generator().manual_seed(19)
    x = torch.randn(2, 3, 4, 5, 6, generator=g)
    grid = torch.rand(2, 3, 4, 2, 3, generator=g) * 2.6 - 1.3
    fn = lambda a, b: torch.nn.functional.grid_sample(a, b, mode=mode, padding_mode=padding, align_corners=align)  # noqa: E731
    _close(_run_native(fn, x, grid), fn(x, grid))


def test_int32_indices_for_scatter_and_index_put() -> None:
    x, src = torch.randn(3, 4), torch.randn(3, 4)
    idx = torch.tensor([[0, 2, 1, 0], [2, 2, 0, 1]], dtype=torch.int32)
    fn = lambda x, i, s: torch.scatter_add(x, 0, i, s[:2])  # noqa: E731
    _close(_run_native(fn, x, idx, src), fn(x, idx.long(), src))
    rows = torch.tensor([2, 0], dtype=torch.int32)
    put = lambda x, r, s: torch.index_put(x, (r,), s[:2], accumulate=True)  # noqa: E731
    _close(_run_native(put, x, rows, src), put(x, rows.long(), src))


def test_searchsorted_with_a_sorter_matches_torch() -> None:
    g = torch.Generator().manual_seed(20)
    seq = torch.randn(2, 6, generator=g)
    sorter = torch.argsort(seq, dim=-1)
    vals = torch.randn(2, 3, generator=g)
    fn = lambda s, v, o: torch.searchsorted(s, v, sorter=o)  # noqa: E731
    torch.testing.assert_close(_run_native(fn, seq, vals, sorter), fn(seq, vals, sorter))


def test_comparisons_of_narrow_integers_and_eye() -> None:
    x = torch.randn(3, 4)

    def fn(t: torch.Tensor) -> Any:
        u = torch.arange(4, dtype=torch.uint8)
        i = torch.arange(3, dtype=torch.int32)
        return u.unsqueeze(0) == i.unsqueeze(1), u >= 2, torch.eye(3, 4) * t, t > 0

    torch.testing.assert_close(_run_native(fn, x), fn(x))
    _close(_run_native(lambda t: torch.linalg.matrix_power(t, 0), x[:, :3]), torch.linalg.matrix_power(x[:, :3], 0))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_matches_torch(mode: str, include_last: bool, padding_idx: int | None) -> None:
    g = torch.Generator().manual_seed(21)
    w = torch.randn(10, 3, generator=g)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 2, 2, 5, 8]) if include_last else torch.tensor([0, 2, 2, 5])

    def fn(w: torch.Tensor, i: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding_bag(
            i, w, o, mode=mode, include_last_offset=include_last, padding_idx=padding_idx
        )

    _close(_run_native(fn, w, idx, offsets), fn(w, idx, offsets))
    psw = torch.rand(8, generator=g)
    if mode == "sum":
        fw = lambda w, i, o, p: torch.nn.functional.embedding_bag(i, w, o, mode="sum", per_sample_weights=p)  # noqa: E731
        _close(_run_native(fw, w.t().contiguous().t(), idx, offsets, psw), fw(w, idx, offsets, psw))
    two_d = lambda w, i: torch.nn.functional.embedding_bag(i, w, mode=mode)  # noqa: E731
    _close(_run_native(two_d, w, idx.view(2, 4)), two_d(w, idx.view(2, 4)))


def test_embedding_bag_out_of_range_index_raises() -> None:
    compiled, _ = compile_with("native_cpu", lambda w, i, o: torch.nn.functional.embedding_bag(i, w, o), cache=False)
    with pytest.raises(Exception):  # noqa: B017 - ours or eager's message
        compiled(torch.randn(4, 2), torch.tensor([0, 7]), torch.tensor([0]))


def test_embedding_bag_auxiliary_outputs_stay_eager() -> None:
    def fn(w: torch.Tensor, i: torch.Tensor, o: torch.Tensor) -> Any:
        return torch.ops.aten._embedding_bag_forward_only(w, i, o, mode=2)

    args = (torch.randn(5, 2), torch.tensor([0, 3, 4]), torch.tensor([0, 1]))
    compiled = torch.compile(fn, backend="torchburn", options={"engine": "native_cpu"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(*args)
    torch.testing.assert_close(got, fn(*args))  # offset2bag, bag_size, max_indices as eager's
