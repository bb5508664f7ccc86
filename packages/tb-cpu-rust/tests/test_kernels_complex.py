"""Complex dtypes and FFTs against PyTorch: conversions into complex64 / complex128 / complex32,
``complex``, ``polar``, ``view_as_complex``, ``angle``, conjugation, and ``torch.fft`` (r2c, c2c,
c2r over one or several dims, every norm mode, padded and cropped signal sizes, non-contiguous
and empty inputs, NaN and infinities), each compiled with native_cpu and no eager fallback."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from native_helpers import check_native

from tb_cpu_rust import _native


def _check(fn: Callable[..., Any], *args: torch.Tensor, **kw: Any) -> None:
    kw.setdefault("rtol", 1e-4)
    kw.setdefault("atol", 1e-5)
    check_native(fn, *args, **kw)


def _randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=g, dtype=dtype)


SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (0, 3)]


# -- conversions and constructors ----------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.complex32])
def test_to_complex_matches_torch(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _randn(*shape) * 3

    def fn(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype)

    # complex32 holds float16 parts: compare them as the float16 values they are
    _check(fn, x, rtol=1e-3 if dtype == torch.complex32 else 1e-4)


def test_to_complex_non_contiguous_and_special_values() -> None:
    x = torch.tensor([[0.0, -1.5, math.nan], [math.inf, -math.inf, 2.0]]).mT
    _check(lambda t: t.to(torch.complex64), x)
    _check(lambda t: t.to(torch.complex128, memory_format=torch.channels_last), _randn(2, 3, 2, 3))


@pytest.mark.parametrize("shapes", [((), ()), ((5,), ()), ((5, 1), (5,)), ((4, 3), (4, 3)), ((0, 2), (2,))])
@pytest.mark.parametrize("fn_name", ["complex", "polar"])
def test_complex_and_polar_match_torch(shapes: tuple[tuple[int, ...], ...], fn_name: str) -> None:
    a, b = _randn(*shapes[0]), _randn(*shapes[1], seed=1)
    if fn_name == "polar":
        a = a.abs()
    f = getattr(torch, fn_name)
    _check(lambda x, y: f(x, y), a, b)


def test_complex_float64_and_special_values() -> None:
    a = torch.tensor([0.0, math.nan, math.inf, -1.0], dtype=torch.float64)
    b = torch.tensor([-math.inf, 1.0, 0.5, math.nan], dtype=torch.float64)
    _check(lambda x, y: torch.complex(x, y), a, b)


@pytest.mark.parametrize("shape", [(2,), (5, 2), (3, 4, 2)])
def test_view_as_complex_matches_torch(shape: tuple[int, ...]) -> None:
    _check(lambda t: torch.view_as_complex(t), _randn(*shape))


def test_angle_of_real_and_complex() -> None:
    x = torch.tensor([-2.0, -0.0, 0.0, 3.0, math.nan, -math.inf, math.inf])
    _check(lambda t: torch.angle(t), x)
    _check(lambda t: torch.angle(t), _randn(4, 5)[:, ::2])
    z = torch.complex(_randn(3, 4), _randn(3, 4, seed=2))
    _check(lambda t: torch.angle(t), z)


def test_conj_physical_and_complex_inputs() -> None:
    z = torch.complex(_randn(3, 4), _randn(3, 4, seed=3))
    _check(lambda t: torch.conj_physical(t), z)
    _check(lambda t: t.clone(), z[:, ::2])


# -- FFTs ----------------------------------------------------------------------------------------

NORMS = [None, "backward", "forward", "ortho"]
ONE_D = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]


@pytest.mark.parametrize("name", ONE_D)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(
    "shape,n,dim",
    [((8,), None, -1), ((31,), None, 0), ((5, 6, 7), 10, 1), ((5, 6, 7), 5, -1), ((1,), None, 0), ((3, 1), None, 1)],
)
def test_fft_1d_matches_torch(name: str, norm: str | None, shape: tuple[int, ...], n: int | None, dim: int) -> None:
    f = getattr(torch.fft, name)
    if name in ("irfft", "hfft") and n is None and shape[dim] == 1:
        n = 2  # the default, 2 * (1 - 1) points, is an error in eager too
    _check(lambda t: f(t, n=n, dim=dim, norm=norm), _randn(*shape))


@pytest.mark.parametrize(
    "name",
    ["fft2", "ifft2", "rfft2", "irfft2", "hfft2", "ihfft2", "fftn", "ifftn", "rfftn", "irfftn", "hfftn", "ihfftn"],
)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("s,dim", [(None, None), ((3, 10), (1, 2)), ((6, 8), None), (None, (0, -1))])
def test_fft_nd_matches_torch(
    name: str, norm: str | None, s: tuple[int, ...] | None, dim: tuple[int, ...] | None
) -> None:
    f = getattr(torch.fft, name)
    kw: dict[str, Any] = {"norm": norm}
    if s is not None:
        kw["s"] = s
    if dim is not None:
        kw["dim"] = dim
    if name.endswith("2") and dim is None and s is None:
        kw["dim"] = (-2, -1)
    _check(lambda t: f(t, **kw), _randn(5, 6, 7))


@pytest.mark.parametrize("name", ["fft", "rfft", "irfft", "fft2", "rfft2", "irfftn", "hfft"])
def test_fft_non_contiguous_input(name: str) -> None:
    f = getattr(torch.fft, name)
    x = _randn(6, 10)
    _check(lambda t: f(t.mT), x)
    _check(lambda t: f(t[:, ::3]), x)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("name", ["fft", "ifft", "fft2", "irfft", "hfft", "ifftn"])
def test_fft_of_complex_inputs(dtype: torch.dtype, name: str) -> None:
    z = torch.complex(_randn(4, 9, dtype=torch.float64), _randn(4, 9, seed=5, dtype=torch.float64)).to(dtype)
    f = getattr(torch.fft, name)
    _check(lambda t: f(t), z)
    _check(lambda t: f(t[:, 1::2], norm="ortho"), z)


def test_fft_float64_is_computed_in_float64() -> None:
    x = _randn(4, 33, dtype=torch.float64)
    _check(lambda t: torch.fft.rfft(t), x, rtol=1e-12, atol=1e-12)
    _check(lambda t: torch.fft.irfft(torch.fft.rfft(t), n=33), x, rtol=1e-12, atol=1e-12)
    _check(lambda t: torch.fft.fft2(t), x, rtol=1e-12, atol=1e-12)


def test_fft_of_empty_batches() -> None:
    x = _randn(0, 8)
    for name in ["fft", "rfft", "irfft", "ifft", "hfft"]:
        f = getattr(torch.fft, name)
        _check(lambda t, f=f: f(t), x)


def test_fft_nan_and_inf() -> None:
    x = _randn(3, 8)
    x[1, 2] = math.nan
    _check(lambda t: torch.fft.rfft(t), x)
    _check(lambda t: torch.fft.fft(t), x)
    y = torch.zeros(2, 6)
    y[0, 0] = math.inf  # a lone infinity at t=0: every bin is +inf (real part), imaginary part 0
    _check(lambda t: torch.fft.rfft(t).real, y)
    _check(lambda t: torch.fft.rfft(t).imag, y)


def test_view_as_real_real_and_imag() -> None:
    z = torch.complex(_randn(3, 4), _randn(3, 4, seed=7))
    # alone in a graph a view stays eager (tb-core): each is followed by arithmetic here
    _check(lambda t: torch.view_as_real(t) * 2, z)
    _check(lambda t: torch.view_as_real(t[:, 1::2]) + 1, z)
    _check(lambda t: (t.real * 1, t.imag - 1), z)
    _check(lambda t: torch.view_as_real(t).to(torch.float32), z.to(torch.complex128))


# -- bad input is an exception, never a crash ------------------------------------------------------


def _spec(op: str, x: tuple[str, list[int]], y: tuple[str, list[int]], params: dict[str, Any]) -> str:
    def strides(sz: list[int]) -> list[int]:
        out, acc = [0] * len(sz), 1
        for i in range(len(sz) - 1, -1, -1):
            out[i], acc = acc, acc * max(sz[i], 1)
        return out

    numel = [math.prod(x[1]), math.prod(y[1])]
    return json.dumps(
        {
            "buffers": [
                {"kind": "input", "dtype": x[0], "numel": numel[0], "sizes": x[1], "strides": strides(x[1])},
                {"kind": "output", "dtype": y[0], "numel": numel[1]},
            ],
            "values": [
                {"buf": 0, "offset": 0, "sizes": x[1], "strides": strides(x[1])},
                {"buf": 1, "offset": 0, "sizes": y[1], "strides": strides(y[1])},
            ],
            "steps": [{"op": op, "ins": [0], "outs": [1], **params}],
        }
    )


# each spec is well-formed for the step schema and wrong in exactly one way, named by `match`
@pytest.mark.parametrize(
    "op,x,y,params,match",
    [
        ("fft_r2c", ("float32", [8]), ("complex64", [8]), {"norm": 0, "flag": 1, "dims": [0]}, "fft_r2c: output shape"),
        (
            "fft_r2c",
            ("float32", [8]),
            ("complex64", [5]),
            {"norm": 5, "flag": 1, "dims": [0]},
            "norm mode must be 0, 1 or 2",
        ),
        ("fft_r2c", ("float32", [8]), ("complex64", [5]), {"norm": 0, "flag": 1, "dims": [3]}, "dim out of range"),
        (
            "fft_r2c",
            ("float32", [8]),
            ("complex64", [5]),
            {"norm": 0, "flag": 1, "dims": []},
            "at least one dim needed",
        ),
        (
            "fft_c2c",
            ("float32", [8]),
            ("complex64", [8]),
            {"norm": 0, "flag": 1, "dims": [0]},
            "complex input and output",
        ),
        (
            "fft_c2r",
            ("complex64", [2]),
            ("float32", [8]),
            {"norm": 0, "flag": 8, "dims": [0]},
            "input too short for the output size",
        ),
        (
            "fft_c2c",
            ("complex64", [4, 4]),
            ("complex64", [4, 4]),
            {"norm": 0, "flag": 1, "dims": [0, 0]},
            "repeated dim",
        ),
        ("complex", ("float32", [3]), ("complex64", [3]), {}, "missing operand 1"),
        ("conj", ("float32", [3]), ("float32", [3]), {}, "conj takes and gives one complex dtype"),
        ("angle", ("complex64", [3]), ("complex64", [3]), {}, "angle gives float32 or float64"),
    ],
    ids=[
        "r2c-one-sided-size",
        "r2c-norm-mode",
        "r2c-dim-out-of-range",
        "r2c-no-dim",
        "c2c-real-input",
        "c2r-too-short",
        "c2c-repeated-dim",
        "complex-one-operand",
        "conj-real",
        "angle-complex-result",
    ],
)
def test_bad_specs_raise(
    op: str, x: tuple[str, list[int]], y: tuple[str, list[int]], params: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        _native.Executor(_spec(op, x, y, params))


def test_the_well_formed_spec_builds() -> None:
    # the control of test_bad_specs_raise: the same spec with nothing wrong is accepted
    _native.Executor(_spec("fft_r2c", ("float32", [8]), ("complex64", [5]), {"norm": 0, "flag": 1, "dims": [0]}))


def test_complex_dtypes_are_read_from_the_tensor() -> None:
    for dtype in (torch.complex32, torch.complex64, torch.complex128):
        assert _native.validate_tensor(torch.zeros(3, 2, dtype=dtype).t()) == 6
    with pytest.raises(ValueError, match="lazily conjugated"):
        _native.validate_tensor(torch.zeros(3, dtype=torch.complex64).conj())
