"""Fused optimizer steps: ``torch.optim.Adam``, ``AdamW`` and ``SGD`` whose ``step`` is one Rust
call per parameter group.

Each class subclasses torch's and keeps its constructor, ``state_dict`` / ``load_state_dict``,
hooks and state layout (``step`` as a 0-d tensor, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq``, ``momentum_buffer``), so it is a drop-in replacement and a checkpoint moves
freely between the two. ``step`` hands every parameter of a group to ``src/optim.rs``, which
updates param and state in one sweep over memory, in parallel, with the GIL released; the
arithmetic is torch's single-tensor path in float32, operation by operation, so results agree
with ``torch.optim`` to float32 rounding.

The native step is taken when every parameter with a gradient is a dense, contiguous float32
CPU tensor (its gradient and state too) and the group leaves ``capturable``,
``differentiable`` and ``fused`` off; anything else runs ``torch.optim``'s own step unchanged.

    from tb_cpu_rust.optim import Adam
    opt = Adam(model.parameters(), lr=1e-3)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.optim as _topt

from tb_cpu_rust import _native
from tb_cpu_rust.threads import use_torch_openmp

use_torch_openmp()  # the step's loops share PyTorch's OpenMP team with the backward's ops

__all__ = ["SGD", "Adam", "AdamW"]

_cpu = torch.device("cpu")
_f32 = torch.float32


def _arg(t: torch.Tensor) -> torch.Tensor:
    # the tensor itself: the native module reads and validates its DLPack description
    return t


def _param_ok(p: torch.Tensor) -> bool:
    g = p.grad
    return (
        p.dtype == _f32
        and p.device == _cpu
        and p.layout == torch.strided
        and p.is_contiguous()
        and g is not None
        and g.dtype == _f32
        and g.layout == torch.strided
        and g.is_contiguous()
        and g.shape == p.shape
    )


def _state_ok(t: Any, p: torch.Tensor) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.dtype == _f32
        and t.device == _cpu
        and t.layout == torch.strided
        and t.is_contiguous()
        and t.shape == p.shape
    )


def _scalar(v: Any) -> float | None:
    """A hyper-parameter as a Python float, or None when it cannot be one (a tensor that needs grad)."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.requires_grad:
            return None
        return float(v.item())
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _hyper(v: Any) -> float:
    """A hyper-parameter that ``_native_ok`` accepted, as the float the native step takes."""
    x = _scalar(v)
    if x is None:
        raise TypeError(f"hyper-parameter {v!r} is not a number")
    return x


def _group_flags_ok(group: dict[str, Any]) -> bool:
    return not (group.get("capturable") or group.get("differentiable") or group.get("fused"))


def _torch_step(cls: type) -> Callable[..., Any]:
    """torch's ``cls.step`` without the hook wrapper torch adds to a class on first use: our own
    ``step`` already carries that wrapper, so a fallback must not run the hooks a second time."""
    step = cls.step  # type: ignore[attr-defined]
    if getattr(step, "hooked", False):
        step = step.__wrapped__
    return step  # type: ignore[no-any-return]


def _run_step(opt: Any, closure: Callable[[], Any] | None, torch_cls: type) -> Any:
    """``opt.step(closure)``: each group through ``opt._native_group`` when ``opt._native_ok()``,
    else ``torch_cls``'s own step."""
    if not opt._native_ok():
        return _torch_step(torch_cls)(opt, closure)
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    with torch.no_grad():
        for group in opt.param_groups:
            opt._native_group(group)
    return loss


def _scalar_dtype() -> torch.dtype:
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class _AdamBase:
    """The native Adam / AdamW step; ``_decoupled`` picks AdamW's decay."""

    _decoupled: bool | None = None  # None: the group's own ``decoupled_weight_decay``
    param_groups: list[dict[str, Any]]
    state: defaultdict[torch.Tensor, Any]  # as torch.optim.Optimizer declares it

    def _native_ok(self) -> bool:
        for group in self.param_groups:
            if not _group_flags_ok(group):
                return False
            if any(_scalar(group[k]) is None for k in ("lr", "eps", "weight_decay")):
                return False
            if any(_scalar(b) is None for b in group["betas"]):
                return False
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse or not _param_ok(p):
                    return False
                st = self.state.get(p)
                if st:
                    names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
                    if not all(_state_ok(st.get(n), p) for n in names):
                        return False
                    step = st.get("step")
                    if not (
                        isinstance(step, torch.Tensor)
                        and step.device == _cpu
                        and step.numel() == 1
                        and step.dtype in (torch.float32, torch.float64)
                    ):
                        return False
        return True

    def _native_group(self, group: dict[str, Any]) -> None:
        ps, gs, ms, vs, mxs, steps = [], [], [], [], [], []
        amsgrad = bool(group["amsgrad"])
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state[p]
            if len(st) == 0:
                st["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if amsgrad:
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            ps.append(_arg(p))
            gs.append(_arg(p.grad))
            ms.append(_arg(st["exp_avg"]))
            vs.append(_arg(st["exp_avg_sq"]))
            if amsgrad:
                mxs.append(_arg(st["max_exp_avg_sq"]))
            steps.append(_arg(st["step"]))
        if not ps:
            return
        beta1, beta2 = (_hyper(b) for b in group["betas"])
        decoupled = self._decoupled if self._decoupled is not None else bool(group.get("decoupled_weight_decay", False))
        _native.optim_adam(
            ps, gs, ms, vs, mxs, steps,
            _hyper(group["lr"]), beta1, beta2, _hyper(group["eps"]), _hyper(group["weight_decay"]),
            decoupled, bool(group["maximize"]), amsgrad,
        )  # fmt: skip


class Adam(_AdamBase, _topt.Adam):
    __doc__ = _topt.Adam.__doc__

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One Adam step over every group: native where possible (module docstring), else torch's."""
        return _run_step(self, closure, _topt.Adam)


class AdamW(_AdamBase, _topt.AdamW):
    __doc__ = _topt.AdamW.__doc__
    _decoupled = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One AdamW step over every group: native where possible (module docstring), else torch's."""
        return _run_step(self, closure, _topt.AdamW)


class SGD(_topt.SGD):
    __doc__ = _topt.SGD.__doc__

    def _native_ok(self) -> bool:
        for group in self.param_groups:
            if not _group_flags_ok(group):
                return False
            if any(_scalar(group[k]) is None for k in ("lr", "momentum", "dampening", "weight_decay")):
                return False
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse or not _param_ok(p):
                    return False
                buf = self.state.get(p, {}).get("momentum_buffer")
                if buf is not None and not _state_ok(buf, p):
                    return False
        return True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One SGD step over every group: native where possible (module docstring), else torch's."""
        return _run_step(self, closure, _topt.SGD)

    def _native_group(self, group: dict[str, Any]) -> None:
        momentum = _hyper(group["momentum"])
        ps, gs, bufs, first = [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            ps.append(_arg(p))
            gs.append(_arg(p.grad))
            if momentum:
                st = self.state[p]
                buf = st.get("momentum_buffer")
                first.append(buf is None)
                if buf is None:
                    buf = st["momentum_buffer"] = torch.empty_like(p, memory_format=torch.preserve_format)
                bufs.append(_arg(buf))
        if ps:
            _native.optim_sgd(
                ps, gs, bufs, first, _hyper(group["lr"]), momentum, _hyper(group["dampening"]),
                _hyper(group["weight_decay"]), bool(group["nesterov"]), bool(group["maximize"]),
            )  # fmt: skip
