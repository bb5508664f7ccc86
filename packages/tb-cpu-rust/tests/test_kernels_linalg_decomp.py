"""Matrix decompositions against PyTorch: QR family (geqrf, linalg.qr, householder_product, ormqr)
entry by entry, singular values and symmetric eigenvalues, and the unique quantities built on the
SVD / eigen decompositions (pinv, polar, matrix_sqrth). Singular vectors and eigenvectors are unique
only up to sign, so graphs that read them must fall back to eager, never return other signs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchburn.testing.conformance import compile_with, native_and_fallback


def _compiled(fn: Callable[..., Any], **options: Any) -> tuple[Any, list[Any]]:
    return compile_with("native_cpu", fn, cache=False, **options)


def _run_native(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    compiled, reports = _compiled(fn)
    with torch.no_grad():
        got = compiled(*args)
    _, fallback = native_and_fallback(reports)
    assert not fallback, fallback
    return got


def _close(got: Any, want: Any, **kw: Any) -> None:
    kw.setdefault("rtol", 1e-4)
    kw.setdefault("atol", 1e-5)
    torch.testing.assert_close(got, want, **kw)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _sym(*shape: int, seed: int = 0) -> torch.Tensor:
    a = _randn(*shape, seed=seed)
    return a + a.mT


def _spd(*shape: int, seed: int = 0) -> torch.Tensor:
    a = _randn(*shape, seed=seed)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


SHAPES = [(5, 5), (6, 4), (4, 6), (1, 1), (2, 3, 5, 4), (3, 4, 3), (0, 0), (3, 0), (0, 3), (0, 4, 4)]


# -- QR: unique given LAPACK's reflectors, so compared entry by entry ----------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_geqrf_and_qr_match_torch(shape: tuple[int, ...], transposed: bool) -> None:
    a = _randn(*shape)
    a = a.mT.contiguous().mT if transposed else a  # a column-major (non-contiguous) input
    _close(_run_native(torch.geqrf, a), torch.geqrf(a))
    for mode in ("reduced", "complete", "r"):

        def qr(x: torch.Tensor, mode: str = mode) -> Any:
            return torch.linalg.qr(x, mode=mode)

        _close(_run_native(qr, a), qr(a))


@pytest.mark.parametrize("shape", [(5, 5), (6, 4), (2, 1, 6, 5), (0, 0), (4, 0)])
def test_householder_product_matches_torch(shape: tuple[int, ...]) -> None:
    qr, tau = torch.geqrf(_randn(*shape, seed=2))
    _close(_run_native(torch.linalg.householder_product, qr, tau), torch.linalg.householder_product(qr, tau))
    # fewer reflectors than columns
    if shape[-1] > 1:
        t = tau[..., :-1].contiguous()
        _close(_run_native(torch.linalg.householder_product, qr, t), torch.linalg.householder_product(qr, t))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize(("qr_shape", "c_shape"), [((5, 5), (5, 3)), ((5, 2), (5, 4)), ((2, 4, 3), (2, 4, 4))])
def test_ormqr_matches_torch(left: bool, transpose: bool, qr_shape: tuple[int, ...], c_shape: tuple[int, ...]) -> None:
    qr, tau = torch.geqrf(_randn(*qr_shape, seed=3))
    c = _randn(*c_shape, seed=4)
    if not left:
        c = c.mT.contiguous()

    def fn(qr: torch.Tensor, tau: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.ormqr(qr, tau, c, left=left, transpose=transpose)

    _close(_run_native(fn, qr, tau, c), fn(qr, tau, c))


# -- singular values and eigenvalues ------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_svdvals_match_torch(shape: tuple[int, ...]) -> None:
    a = _randn(*shape, seed=5)
    _close(_run_native(torch.linalg.svdvals, a), torch.linalg.svdvals(a))
    _close(_run_native(torch.linalg.svdvals, a.mT), torch.linalg.svdvals(a.mT))


def test_svdvals_of_rank_deficient_and_ill_conditioned() -> None:
    u = _randn(6, 2, seed=6)
    low_rank = u @ u.mT  # rank 2
    hilbert = 1.0 / (torch.arange(6.0)[:, None] + torch.arange(6.0)[None, :] + 1.0)
    for a in (low_rank, hilbert, torch.zeros(4, 3)):
        want = torch.linalg.svdvals(a)
        # small singular values of an ill-conditioned float32 matrix are only known to ~eps * s_max
        _close(_run_native(torch.linalg.svdvals, a), want, atol=1e-5 * float(want.max().clamp_min(1)), rtol=1e-4)
    _close(_run_native(torch.linalg.matrix_norm, low_rank, "nuc"), torch.linalg.matrix_norm(low_rank, "nuc"))
    _close(_run_native(torch.linalg.cond, _randn(2, 4, 4)), torch.linalg.cond(_randn(2, 4, 4)))


@pytest.mark.parametrize("shape", [(5, 5), (1, 1), (2, 3, 4, 4), (0, 0), (0, 3, 3)])
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigvalsh_matches_torch(shape: tuple[int, ...], uplo: str) -> None:
    a = _randn(*shape, seed=7)  # not symmetric: only the named triangle may be read

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigvalsh(x, UPLO=uplo)

    _close(_run_native(fn, a), fn(a))


def test_eigvalsh_repeated_eigenvalues() -> None:
    q, _ = torch.linalg.qr(_randn(5, 5, seed=8))
    a = q @ torch.diag(torch.tensor([1.0, 1.0, 1.0, -2.0, 3.0])) @ q.mT
    _close(_run_native(torch.linalg.eigvalsh, a), torch.linalg.eigvalsh(a))


@pytest.mark.parametrize("fn", [torch.linalg.svd, torch.linalg.eigh])
def test_graphs_reading_vectors_fall_back(fn: Callable[..., Any]) -> None:
    """Singular vectors / eigenvectors differ from LAPACK's by sign: such graphs stay eager."""
    a = _sym(4, 4, seed=9)
    compiled, reports = _compiled(fn, fallback="eager")
    with torch.no_grad():
        got = compiled(a)
    _, fallback = native_and_fallback(reports)
    assert fallback
    _close(tuple(got), tuple(fn(a)))


# -- built on the SVD / eigen decompositions -----------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 5), (6, 3), (3, 6), (2, 4, 3), (0, 0), (3, 0), (0, 2, 2)])
def test_pinv_matches_torch(shape: tuple[int, ...]) -> None:
    a = _randn(*shape, seed=10)
    _close(_run_native(torch.linalg.pinv, a), torch.linalg.pinv(a))
    _close(_run_native(torch.pinverse, a), torch.pinverse(a))


def test_pinv_singular_hermitian_and_tolerances() -> None:
    u = _randn(5, 2, seed=11)
    low_rank = u @ u.mT
    _close(_run_native(torch.linalg.pinv, low_rank), torch.linalg.pinv(low_rank))
    sym = _sym(2, 4, 4, seed=12)

    def herm(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.pinv(x, hermitian=True)

    _close(_run_native(herm, sym), herm(sym))
    a = _randn(4, 4, seed=13)
    s = torch.linalg.svdvals(a)
    cut = (s[1] + s[2]) / 2  # drops the two smallest singular values
    batch = torch.stack([a, 2 * a])
    cuts = torch.stack([cut, cut / 1e3]).double()  # per-matrix float64 tolerances

    def tols(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.linalg.pinv(x, atol=t)

    def rel(x: torch.Tensor, t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.linalg.pinv(x, atol=t, rtol=r)

    rtols = cuts / s[0]
    _close(_run_native(tols, batch, cuts), tols(batch, cuts))
    _close(_run_native(rel, batch, torch.zeros_like(cuts), rtols), rel(batch, torch.zeros_like(cuts), rtols))


@pytest.mark.parametrize("shape", [(5, 5), (5, 3), (2, 2), (2, 5, 5), (2, 5, 3)])
def test_polar_matches_torch(shape: tuple[int, ...]) -> None:
    a = _randn(*shape, seed=14)
    _close(_run_native(torch.linalg.polar, a), torch.linalg.polar(a))


@pytest.mark.parametrize("shape", [(5, 5), (1, 1), (2, 4, 4), (0, 0), (0, 3, 3)])
def test_matrix_sqrth_matches_torch(shape: tuple[int, ...]) -> None:
    a = _spd(*shape, seed=15) if shape[-1] else torch.zeros(shape)
    _close(_run_native(torch.linalg.matrix_sqrth, a), torch.linalg.matrix_sqrth(a))
    strict = a.tril()  # only the lower triangle is read
    _close(_run_native(torch.linalg.matrix_sqrth, strict), torch.linalg.matrix_sqrth(strict))


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [torch.linalg.svdvals, torch.linalg.eigvalsh, torch.linalg.pinv, torch.linalg.polar])
def test_non_finite_input_raises_as_torch_does(fn: Callable[..., Any]) -> None:
    a = torch.full((3, 3), float("nan"))
    with pytest.raises(Exception, match="failed to converge"):
        fn(a)
    compiled, _ = _compiled(fn)
    with pytest.raises(Exception, match="non-finite"):
        compiled(a)


def test_qr_of_nan_propagates_as_torch() -> None:
    a = torch.full((3, 3), float("nan"))
    _close(_run_native(torch.geqrf, a), torch.geqrf(a), equal_nan=True)
