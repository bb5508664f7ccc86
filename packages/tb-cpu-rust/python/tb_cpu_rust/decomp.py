"""Matrix decompositions (QR, SVD, symmetric eigen and what is built on them): which nodes native_cpu
takes, and their lowering to the ``linalg_decomp`` kernels (src/linalg_decomp.rs).

Singular vectors and eigenvectors are unique only up to sign (and a rotation inside repeated
values); the kernels do not reproduce LAPACK's choice, so a node is taken only when a graph does not
read those vectors (``svdvals``, ``matrix_norm(ord="nuc")``, ``cond``, ``eigvalsh``, ...) or they are
empty. QR follows LAPACK's reflector convention and matches ATen entry by entry.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

F32 = torch.float32

DECOMP = frozenset({
    "aten.geqrf.default", "aten.linalg_householder_product.default", "aten.ormqr.default",
    "aten.linalg_qr.default", "aten._linalg_svd.default", "aten._linalg_eigh.default",
    "aten.linalg_pinv.atol_rtol_tensor", "aten.linalg_polar.default", "aten.linalg_matrix_sqrth.default",
})  # fmt: skip

#: multi-output ops: which outputs are vectors that are unique only up to sign
_VECTOR_OUTPUTS = {"aten._linalg_svd.default": (0, 2), "aten._linalg_eigh.default": (1,)}
_TOLERANCES = (torch.float32, torch.float64)


def _arg(info: Any, i: int, name: str, default: Any) -> Any:
    if len(info.args) > i:
        return info.args[i]
    return info.kwargs.get(name, default)


def _vectors_read(node: Any, outputs: tuple[int, ...]) -> bool:
    for user in node.users:
        if user.target is not operator.getitem:
            return True
        if user.args[1] in outputs and user.users:
            return True
    return False


def check_decomp(info: Any) -> str | None:
    """None when native_cpu takes the decomposition node, else the reason."""
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
    if op == "aten.linalg_qr.default" and _arg(info, 1, "mode", "reduced") not in ("reduced", "complete", "r"):
        return "qr mode"
    if op == "aten._linalg_eigh.default" and str(_arg(info, 1, "UPLO", "L")).upper() not in ("L", "U"):
        return "eigh UPLO"
    if op == "aten.linalg_householder_product.default" and info.inputs[1].shape[:-1] != shape[:-2]:
        return "householder_product with broadcast batch dims"
    if op == "aten.ormqr.default" and not (info.inputs[1].shape[:-1] == shape[:-2] == info.inputs[2].shape[:-2]):
        return "ormqr with broadcast batch dims"
    return None


def lower_decomp(lw: Any, node: Any) -> Any:
    """Steps for one decomposition node; returns its output value ids (as ``lower_linalg`` does)."""
    op, a, kw, out = node.op, list(node.args), dict(node.kwargs), node.out

    def arg(i: int, name: str, default: Any) -> Any:
        return a[i] if len(a) > i else kw.get(name, default)

    def step(name: str, ins: list[Any], outs: list[int], ints: list[int] | None = None) -> None:
        lw.steps.append({"op": name, "ins": ins, "outs": outs, "ints": ints or []})

    x = lw.value(a[0])
    if op == "aten.geqrf.default":
        outs = [lw.fresh(m) for m in out]
        step("geqrf", [x], outs)
        return tuple(outs)
    if op == "aten.linalg_householder_product.default":
        q = lw.fresh(out)
        step("orgqr", [x, lw.value(a[1])], [q])
        return q
    if op == "aten.ormqr.default":
        r = lw.fresh(out)
        left, transpose = bool(arg(3, "left", True)), bool(arg(4, "transpose", False))
        step("ormqr", [x, lw.value(a[1]), lw.value(a[2])], [r], [int(left), int(transpose)])
        return r
    if op == "aten.linalg_qr.default":
        mode = {"reduced": 0, "complete": 1, "r": 2}[arg(1, "mode", "reduced")]
        outs = [lw.fresh(m) for m in out]
        step("qr", [x], outs, [mode])
        return tuple(outs)
    if op == "aten._linalg_svd.default":
        full, uv = bool(arg(1, "full_matrices", False)), bool(arg(2, "compute_uv", True))
        outs = [lw.fresh(m) for m in out]
        step("svd", [x], outs, [int(full), int(uv)])
        return tuple(outs)
    if op == "aten._linalg_eigh.default":
        upper = str(arg(1, "UPLO", "L")).upper() == "U"
        compute_v = bool(arg(2, "compute_v", True))
        outs = [lw.fresh(m) for m in out]
        step("eigh", [x], outs, [int(upper), int(compute_v)])
        return tuple(outs)
    if op == "aten.linalg_pinv.atol_rtol_tensor":
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
                step("cast", [t], [t32])
                t = t32
            tols.append(lw.broadcast(t, batch))
        step("pinv", [x, *tols], [res], [int(bool(kw.get("hermitian", False)))])
        return res
    if op == "aten.linalg_polar.default":
        outs = [lw.fresh(m) for m in out]
        step("linalg_polar", [x], outs)
        return tuple(outs)
    if op == "aten.linalg_matrix_sqrth.default":
        res = lw.fresh(out)
        step("sqrth", [x], [res])
        return res
    raise NotImplementedError(op)
