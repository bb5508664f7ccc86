"""The one table from ATen op to its native_cpu lowering, filled by ``register_lowering`` in the
family modules. What the engine supports (``supported_ops``, ``check``, the op-coverage docs) is
read from this table; there is no second list.

An op has at most one default lowering and any number of ``when`` variants, tried first (say a
copy that reads float64 takes the ``cast`` step instead of an elementwise program). Dtype
families (complex values, compute in float64) claim a node by its dtypes before its op's own
entry is consulted, except for entries registered ``any_dtype`` (views, which only restride).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tb_cpu_rust.lowering.lowerer import Lowerer

#: ``check(info) -> None`` when native_cpu takes the node, else the reason (``torchburn.explain``)
Check = Callable[[Any], "str | None"]
#: ``lower(lowerer, node) -> value`` (a value id, a lazy register, or a tuple of them)
LowerFn = Callable[["Lowerer", Any], Any]
#: ``when(lowerer, node) -> bool``: the variant applies to this node
When = Callable[["Lowerer", Any], bool]


class LoweringError(ValueError):
    pass


@dataclass(frozen=True)
class Lowering:
    op: str
    fn: LowerFn
    check: Check
    family: str
    when: When | None = None
    any_dtype: bool = False


@dataclass(frozen=True)
class DtypeFamily:
    """Nodes whose dtypes a family decides on, whatever their op (``claims`` sees a NodeInfo,
    ``claims_node`` a plan node during lowering)."""

    name: str
    claims: Callable[[Any], bool]
    check: Check
    claims_node: When
    lower: LowerFn


#: op -> its lowerings, ``when`` variants first and the default last
LOWERINGS: dict[str, list[Lowering]] = {}
DTYPE_FAMILIES: list[DtypeFamily] = []


def _no_check(info: Any) -> str | None:
    return None


def register_lowering(
    *ops: str, check: Check | None = None, when: When | None = None, any_dtype: bool = False
) -> Callable[[LowerFn], LowerFn]:
    """Registers the decorated ``fn(lowerer, node)`` as the lowering of ``ops``; ``check`` decides
    which nodes of them native_cpu takes (None: every node)."""

    def deco(fn: LowerFn) -> LowerFn:
        family = fn.__module__.rsplit(".", 1)[-1]
        for op in ops:
            entry = Lowering(op, fn, check or _no_check, family, when, any_dtype)
            variants = LOWERINGS.setdefault(op, [])
            if when is None:
                if variants and variants[-1].when is None:
                    raise ValueError(f"{op} already has a default lowering in {variants[-1].family}")
                variants.append(entry)
            else:
                variants.insert(0, entry)
        return fn

    return deco


def register_dtype_family(family: DtypeFamily) -> None:
    DTYPE_FAMILIES.append(family)


def supported_ops() -> frozenset[str]:
    return frozenset(op for op, variants in LOWERINGS.items() if any(v.when is None for v in variants))


def families() -> dict[str, list[str]]:
    """Family module -> the ops whose default lowering it holds (for docs and tests)."""
    out: dict[str, list[str]] = {}
    for op in sorted(supported_ops()):
        out.setdefault(_default(op).family, []).append(op)
    return out


def _default(op: str) -> Lowering:
    return LOWERINGS[op][-1]


def check(info: Any) -> str | None:
    """None when native_cpu takes the node, else the reason (shown by ``torchburn.explain``)."""
    op = info.op
    if op not in LOWERINGS or _default(op).when is not None:
        return "no native kernel"
    if info.symbolic:
        return "symbolic shape"
    for m in [*info.inputs, *info.out_metas]:
        if m.device != "cpu":
            return f"device {m.device}"
    device = info.kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return "not a cpu tensor"
    entry = _default(op)
    if not entry.any_dtype:
        for fam in DTYPE_FAMILIES:
            if fam.claims(info):
                return fam.check(info)
    return entry.check(info)


def lowering_for(lw: Lowerer, node: Any) -> LowerFn:
    variants = LOWERINGS.get(node.op)
    if not variants:
        raise LoweringError(f"no lowering for {node.op}")
    if not variants[-1].any_dtype:
        for fam in DTYPE_FAMILIES:
            if fam.claims_node(lw, node):
                return fam.lower
    for v in variants:
        if v.when is None or v.when(lw, node):
            return v.fn
    raise LoweringError(f"no lowering for {node.op}")


def ops_of(*tables: Iterable[str]) -> frozenset[str]:
    return frozenset(op for t in tables for op in t)
