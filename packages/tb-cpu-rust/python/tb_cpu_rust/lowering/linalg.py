"""Dense linear algebra on float32 matrices: LU (factor, unpack, solve, inverse, det), Cholesky,
triangular solves, and the decompositions QR, SVD and symmetric eigen with what is built on them
(``linalg`` and ``linalg_decomp`` kernels; int32 pivots and info).

Singular vectors and eigenvectors are unique only up to sign (and a rotation inside repeated
values); the kernels do not reproduce LAPACK's choice, so a node is taken only when a graph does not
read those vectors (``svdvals``, ``matrix_norm(ord="nuc")``, ``cond``, ``eigvalsh``, ...) or they are
empty. QR follows LAPACK's reflector convention and matches ATen entry by entry.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import F32, I32
from tb_cpu_rust.lowering.lowerer import Lowerer, contig
from tb_cpu_rust.lowering.registry import register_lowering


def _arg(node: Any, i: int, name: str, default: Any) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def check_linalg(info: Any) -> str | None:
    for m in info.inputs:
        if m.dtype not in (F32, I32):
            return f"dtype {m.dtype} (linalg takes float32 matrices and int32 pivots)"
    for m in info.out_metas:
        if m.dtype not in (F32, I32):
            return f"dtype {m.dtype} (linalg gives float32 and int32)"
    if not info.inputs or info.inputs[0].dtype != F32 or len(info.inputs[0].shape) < 2:
        return "linalg needs a float32 matrix (or a batch of them) first"
    if info.op in ("aten.linalg_lu_factor_ex.default", "aten.linalg_lu.default") and not info.kwargs.get("pivot", True):
        return "LU without pivoting"
    if info.op == "aten.lu_unpack.default" and info.inputs[0].shape[:-2] != info.inputs[1].shape[:-1]:
        return "lu_unpack with broadcast batch dims"
    return None


def lu_factor(lw: Lowerer, a: int, check: bool, outs: list[int] | None = None) -> list[int]:
    """LU, pivots, info of value ``a`` (fresh contiguous temporaries unless ``outs`` is given)."""
    sz = lw.values[a]["sizes"]
    if outs is None:
        outs = [*lu_factor_temps(lw, a), lw.temp(list(sz[:-2]), I32)]
    lw.steps.append(S.LuFactor(a=a, lu=outs[0], pivots=outs[1], info=outs[2], check=check))
    return outs


def lu_factor_temps(lw: Lowerer, a: int) -> list[int]:
    sz = lw.values[a]["sizes"]
    return [lw.temp(list(sz)), lw.temp([*sz[:-2], min(sz[-2], sz[-1])], I32)]


def lu_solve(lw: Lowerer, lu: int, piv: int, b: int, x: int, left: bool, adjoint: bool) -> None:
    """X from the LU of A: A X = B (left) or X A = B, with A^T when ``adjoint``; broadcasts the batch."""
    xs = lw.values[x]["sizes"]
    n = xs[-2] if left else xs[-1]
    lu = lw.broadcast(lu, (*xs[:-2], n, n))
    piv = lw.broadcast(piv, (*xs[:-2], n))
    b = lw.broadcast(b, tuple(xs))
    if left:
        lw.steps.append(S.LuSolve(lu=lu, pivots=piv, b=b, x=x, adjoint=adjoint))
    else:  # X A = B  <=>  A^T X^T = B^T
        bt = lw.mT(b)
        lw.steps.append(S.LuSolve(lu=lu, pivots=piv, b=bt, x=lw.mT(x), adjoint=not adjoint))


@register_lowering("aten.linalg_lu_factor_ex.default", check=check_linalg)
def _lu_factor_ex(lw: Lowerer, node: Any) -> tuple[int, ...]:
    outs = [lw.fresh(m) for m in node.out]
    lu_factor(lw, lw.value(node.args[0]), bool(node.kwargs.get("check_errors", False)), outs)
    return tuple(outs)


@register_lowering("aten.linalg_lu.default", check=check_linalg)
def _lu(lw: Lowerer, node: Any) -> tuple[int, ...]:
    outs = [lw.fresh(m) for m in node.out]
    lw.steps.append(S.Lu(a=lw.value(node.args[0]), outs=outs))
    return tuple(outs)


@register_lowering("aten.lu_unpack.default", check=check_linalg)
def _lu_unpack(lw: Lowerer, node: Any) -> tuple[int, ...]:
    data, pivots = bool(_arg(node, 2, "unpack_data", True)), bool(_arg(node, 3, "unpack_pivots", True))
    outs = [lw.fresh(m) for m in node.out]
    lu, piv = lw.value(node.args[0]), lw.value(node.args[1])
    lw.steps.append(S.LuUnpack(lu=lu, pivots=piv, outs=outs, unpack_data=data, unpack_pivots=pivots))
    return tuple(outs)


@register_lowering("aten.linalg_lu_solve.default", check=check_linalg)
def _lu_solve(lw: Lowerer, node: Any) -> int:
    left, adjoint = bool(node.kwargs.get("left", True)), bool(node.kwargs.get("adjoint", False))
    x = lw.fresh(node.out)
    a = node.args
    lu_solve(lw, lw.value(a[0]), lw.value(a[1]), lw.value(a[2]), x, left, adjoint)
    return x


@register_lowering("aten._linalg_solve_ex.default", check=check_linalg)
def _solve(lw: Lowerer, node: Any) -> tuple[int, ...]:
    a, kw = list(node.args), dict(node.kwargs)
    left = bool(kw.get("left", a[2] if len(a) > 2 else True))
    check = bool(kw.get("check_errors", False))
    av, bv = lw.value(a[0]), lw.value(a[1])
    res, lu, piv, info = (lw.fresh(m) for m in node.out)
    asz, bsz = lw.values[av]["sizes"], lw.values[bv]["sizes"]
    vector = len(bsz) == 1 or (len(bsz) == len(asz) - 1 and list(bsz) == list(asz[:-1]))
    # as ATen: factor A^T when A is contiguous and solve with the adjoint
    use_t = contig(list(asz)) == list(lw.values[av]["strides"])
    lu_factor(lw, lw.mT(av) if use_t else av, check, [lu, piv, info])
    if vector:
        bv, rv = lw.unsq(bv, -1 if left else -2), lw.unsq(res, -1 if left else -2)
    else:
        rv = res
    lu_solve(lw, lu, piv, bv, rv, left, use_t)
    return res, lu, piv, info


@register_lowering("aten.linalg_inv_ex.default", check=check_linalg)
def _inv(lw: Lowerer, node: Any) -> tuple[int, ...]:
    check = bool(node.kwargs.get("check_errors", False))
    inv, info = (lw.fresh(m) for m in node.out)
    av = lw.value(node.args[0])
    lu, piv, _ = lu_factor(lw, av, check, [*lu_factor_temps(lw, av), info])
    lw.steps.append(S.LuSolve(lu=lu, pivots=piv, b=None, x=inv))
    return inv, info


@register_lowering("aten._linalg_det.default", "aten._linalg_slogdet.default", check=check_linalg)
def _det(lw: Lowerer, node: Any) -> tuple[int, ...]:
    outs = [lw.fresh(m) for m in node.out]
    kind = S.Det if node.op == "aten._linalg_det.default" else S.Slogdet
    lw.steps.append(kind(a=lw.value(node.args[0]), outs=outs))
    return tuple(outs)


@register_lowering("aten.linalg_cholesky_ex.default", check=check_linalg)
def _cholesky(lw: Lowerer, node: Any) -> tuple[int, ...]:
    upper = bool(node.kwargs.get("upper", False))
    check = bool(node.kwargs.get("check_errors", False))
    lv, info = (lw.fresh(m) for m in node.out)
    av = lw.value(node.args[0])
    a_in, kout = (lw.mT(av), lw.mT(lv)) if upper else (av, lv)
    lw.steps.append(S.Cholesky(a=a_in, lower=kout, info=info, check=check))
    return lv, info


@register_lowering("aten.cholesky_solve.default", "aten.cholesky_inverse.default", check=check_linalg)
def _cholesky_solve(lw: Lowerer, node: Any) -> int:
    a = list(node.args)
    inverse = node.op == "aten.cholesky_inverse.default"
    upper = bool(a[1] if inverse and len(a) > 1 else a[2] if len(a) > 2 else node.kwargs.get("upper", False))
    x = lw.fresh(node.out)
    xs = list(node.out.shape)
    fac = lw.value(a[0] if inverse else a[1])
    fac = lw.broadcast(fac, (*xs[:-2], xs[-2], xs[-2]))
    b = None if inverse else lw.broadcast(lw.value(a[0]), tuple(xs))
    y = lw.temp(xs)
    # A = L L^T: L y = b, L^T x = y;  A = U^T U: U^T y = b, U x = y
    first, second = (lw.mT(fac), fac) if upper else (fac, lw.mT(fac))
    lw.steps.append(S.TriSolve(t=first, b=b, x=y))
    lw.steps.append(S.TriSolve(t=second, b=y, x=x, upper=True))
    return x


@register_lowering("aten.linalg_solve_triangular.default", check=check_linalg)
def _solve_triangular(lw: Lowerer, node: Any) -> int:
    a, kw = list(node.args), dict(node.kwargs)
    upper = bool(kw.get("upper", a[2] if len(a) > 2 else False))
    left = bool(kw.get("left", True))
    unit = bool(kw.get("unitriangular", False))
    x = lw.fresh(node.out)
    xs = list(node.out.shape)
    n = xs[-2] if left else xs[-1]
    t = lw.broadcast(lw.value(a[0]), (*xs[:-2], n, n))
    b = lw.broadcast(lw.value(a[1]), tuple(xs))
    if left:
        lw.steps.append(S.TriSolve(t=t, b=b, x=x, upper=upper, unitriangular=unit))
    else:  # X A = B  <=>  A^T X^T = B^T
        tt, bt = lw.mT(t), lw.mT(b)
        lw.steps.append(S.TriSolve(t=tt, b=bt, x=lw.mT(x), upper=not upper, unitriangular=unit))
    return x


@register_lowering("aten.triangular_solve.default", check=check_linalg)
def _triangular_solve(lw: Lowerer, node: Any) -> tuple[int, ...]:
    a = list(node.args)
    upper = bool(_arg(node, 2, "upper", True))
    trans = bool(_arg(node, 3, "transpose", False))
    unit = bool(_arg(node, 4, "unitriangular", False))
    sol, coef = (lw.fresh(m) for m in node.out)
    xs = list(node.out[0].shape)
    t = lw.broadcast(lw.value(a[1]), (*xs[:-2], xs[-2], xs[-2]))
    b = lw.broadcast(lw.value(a[0]), tuple(xs))
    lw.steps.append(S.TriSolve(t=lw.mT(t) if trans else t, b=b, x=sol, upper=upper != trans, unitriangular=unit))
    lw.copy_into(lw.broadcast(lw.value(a[1]), tuple(node.out[1].shape)), coef)
    return sol, coef


def _check_info(info: Any) -> str | None:
    return None if [m.dtype for m in info.inputs] == [I32] else "info must be int32"


@register_lowering("aten._linalg_check_errors.default", check=_check_info)
def _linalg_check_errors(lw: Lowerer, node: Any) -> None:
    lw.steps.append(S.CheckInfo(info=lw.value(node.args[0])))


# -- QR, SVD, symmetric eigen ----------------------------------------------------------------------
#: multi-output ops: which outputs are vectors that are unique only up to sign
_VECTOR_OUTPUTS = {"aten._linalg_svd.default": (0, 2), "aten._linalg_eigh.default": (1,)}
_TOLERANCES = (torch.float32, torch.float64)


def _vectors_read(node: Any, outputs: tuple[int, ...]) -> bool:
    for user in node.users:
        if user.target is not operator.getitem:
            return True
        if user.args[1] in outputs and user.users:
            return True
    return False


def check_decomp(info: Any) -> str | None:
    op = info.op
    if not info.inputs or info.inputs[0].dtype != F32 or len(info.inputs[0].shape) < 2:
        return "decompositions need a float32 matrix (or a batch of them)"
    for k, m in enumerate(info.inputs):
        if m.dtype != F32 and not (op == "aten.linalg_pinv.atol_rtol_tensor" and k > 0 and m.dtype in _TOLERANCES):
            return f"dtype {m.dtype} (decompositions take float32)"
    outs = info.out if isinstance(info.out, tuple) else (info.out,)
    if any(m is None or m.dtype != F32 for m in outs):
        return "decompositions give float32"
    shape = info.inputs[0].shape
    if op in _VECTOR_OUTPUTS and all(shape) and info.node is not None:
        wants = _arg(info, 2, "compute_uv" if op == "aten._linalg_svd.default" else "compute_v", True)
        if wants and _vectors_read(info.node, _VECTOR_OUTPUTS[op]):
            return "singular vectors / eigenvectors are read (their signs would differ from LAPACK's)"
    if op == "aten.linalg_qr.default" and _arg(info, 1, "mode", "reduced") not in _QR_MODES:
        return "qr mode"
    if op == "aten._linalg_eigh.default" and str(_arg(info, 1, "UPLO", "L")).upper() not in ("L", "U"):
        return "eigh UPLO"
    if op == "aten.linalg_householder_product.default" and info.inputs[1].shape[:-1] != shape[:-2]:
        return "householder_product with broadcast batch dims"
    if op == "aten.ormqr.default" and not (info.inputs[1].shape[:-1] == shape[:-2] == info.inputs[2].shape[:-2]):
        return "ormqr with broadcast batch dims"
    return None


_QR_MODES = {"reduced": 0, "complete": 1, "r": 2}


#: decompositions of one matrix into a list of results: op -> (step kind, its params from the node)
_DECOMPOSITIONS: dict[str, tuple[Any, Any]] = {
    "aten.geqrf.default": (S.Geqrf, lambda node: {}),
    "aten.linalg_qr.default": (S.Qr, lambda node: {"mode": _QR_MODES[_arg(node, 1, "mode", "reduced")]}),
    "aten._linalg_svd.default": (
        S.Svd,
        lambda node: {
            "full_matrices": bool(_arg(node, 1, "full_matrices", False)),
            "compute_uv": bool(_arg(node, 2, "compute_uv", True)),
        },
    ),
    "aten._linalg_eigh.default": (
        S.Eigh,
        lambda node: {
            "upper": str(_arg(node, 1, "UPLO", "L")).upper() == "U",
            "compute_v": bool(_arg(node, 2, "compute_v", True)),
        },
    ),
    "aten.linalg_polar.default": (S.LinalgPolar, lambda node: {}),
}


@register_lowering(*_DECOMPOSITIONS, check=check_decomp)
def _decomposition(lw: Lowerer, node: Any) -> tuple[int, ...]:
    kind, params = _DECOMPOSITIONS[node.op]
    x = lw.value(node.args[0])
    outs = [lw.fresh(m) for m in node.out]
    lw.steps.append(kind(a=x, outs=outs, **params(node)))
    return tuple(outs)


@register_lowering("aten.linalg_householder_product.default", check=check_decomp)
def _householder_product(lw: Lowerer, node: Any) -> int:
    x = lw.value(node.args[0])
    q = lw.fresh(node.out)
    lw.steps.append(S.Orgqr(a=x, tau=lw.value(node.args[1]), q=q))
    return q


@register_lowering("aten.ormqr.default", check=check_decomp)
def _ormqr(lw: Lowerer, node: Any) -> int:
    x = lw.value(node.args[0])
    r = lw.fresh(node.out)
    left, transpose = bool(_arg(node, 3, "left", True)), bool(_arg(node, 4, "transpose", False))
    tau, c = lw.value(node.args[1]), lw.value(node.args[2])
    lw.steps.append(S.Ormqr(a=x, tau=tau, c=c, out=r, left=left, transpose=transpose))
    return r


@register_lowering("aten.linalg_pinv.atol_rtol_tensor", check=check_decomp)
def _pinv(lw: Lowerer, node: Any) -> int:
    kw, out = dict(node.kwargs), node.out
    x = lw.value(node.args[0])
    res = lw.fresh(out)
    batch = tuple(out.shape[:-2])
    xs = lw.values[x]["sizes"]
    x = lw.broadcast(x, (*batch, xs[-2], xs[-1]))
    tols: list[int | None] = []
    for k in ("atol", "rtol"):
        if kw.get(k) is None:
            tols.append(None)
            continue
        # float64 tolerances are rounded to float32: only the storage kernels take float64
        t = lw.value(kw[k])
        if lw.dtype_of(t) != F32:
            t32 = lw.temp(list(lw.values[t]["sizes"]))
            lw.steps.append(S.Cast(x=t, y=t32))
            t = t32
        tols.append(lw.broadcast(t, batch))
    lw.steps.append(S.Pinv(a=x, atol=tols[0], rtol=tols[1], out=res, hermitian=bool(kw.get("hermitian", False))))
    return res


@register_lowering("aten.linalg_matrix_sqrth.default", check=check_decomp)
def _sqrth(lw: Lowerer, node: Any) -> int:
    x = lw.value(node.args[0])
    res = lw.fresh(node.out)
    lw.steps.append(S.Sqrth(a=x, out=res))
    return res
