"""``turbo_torch.optim``: ``torch.optim`` with Adam, AdamW and SGD steps as multi-tensor updates.

``Adam``, ``AdamW`` and ``SGD`` subclass torch's. Their ``step`` gathers every parameter of a
group once and runs each stage of the update as one ``torch._foreach_*`` call over the whole
group, instead of a Python loop of per-parameter ops. Each foreach op applies, per tensor, the
same ATen kernel with the same scalar that ``torch.optim``'s single-tensor path (the CPU
default) applies, in the same order, so parameters and optimizer state are bit-identical.

The fast step is taken only where that equivalence holds: CPU, dense, real floating-point
tensors; ``foreach``/``fused`` left at their defaults; no ``amsgrad``, ``maximize``,
``capturable``, ``differentiable``, tensor ``lr``, closure, or step hook. Anything else runs
``torch.optim``'s own step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.optim as _topt
from torch.optim.optimizer import Optimizer as _Optimizer
from torch.optim.optimizer import _get_scalar_dtype

from tb_cython_dispatch import _impl

_Tensor = torch.Tensor
_strided = torch.strided
_cpu = torch.device("cpu")


def __getattr__(name: str) -> Any:
    value = getattr(_topt, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_topt)))


def _torch_step(cls: type) -> Any:
    """torch's step for ``cls``, wrapped with its hook/profiling wrapper as torch would be."""
    step = getattr(cls, "step")  # noqa: B009 - a class attribute mypy cannot see on `type`
    if not getattr(step, "hooked", False):
        step = _Optimizer.profile_hook_step(step)
    return step


def _hooks_free(opt: _Optimizer) -> bool:
    from torch.optim import optimizer as _om

    return not (
        opt._optimizer_step_pre_hooks
        or opt._optimizer_step_post_hooks
        or _om._global_optimizer_pre_hooks
        or _om._global_optimizer_post_hooks
    )


def _eligible_tensor(p: Any, g: Any) -> bool:
    return (
        g.layout is _strided and p.device == _cpu and g.device == _cpu and p.is_floating_point() and g.dtype == p.dtype
    )


def _zero_grad_fast(opt: _Optimizer, set_to_none: bool) -> bool:
    if not set_to_none or not _impl.core.CACHE.enabled:
        return False
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad = None
    return True


class _Fast:
    """Shared gate for the fast step."""

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        if not _zero_grad_fast(self, set_to_none):  # type: ignore[arg-type]
            super().zero_grad(set_to_none)  # type: ignore[misc]

    def _fast_ok(self, closure: Any) -> bool:
        return closure is None and _impl.core.CACHE.enabled and _hooks_free(self)  # type: ignore[arg-type]


def _gather(group: dict[str, Any]) -> tuple[list[Any], list[Any]] | None:
    params, grads = [], []
    for p in group["params"]:
        g = p.grad
        if g is None:
            continue
        if not _eligible_tensor(p, g):
            return None
        params.append(p)
        grads.append(g)
    return params, grads


def _adam_group_ok(group: dict[str, Any]) -> bool:
    return (
        not group["foreach"]
        and not group["fused"]
        and not group["amsgrad"]
        and not group["maximize"]
        and not group["capturable"]
        and not group["differentiable"]
        and isinstance(group["lr"], float | int)
        and all(isinstance(b, float | int) for b in group["betas"])
        and isinstance(group["weight_decay"], float | int)
        and isinstance(group["eps"], float | int)
    )


def _adam_step(opt: _topt.Adam) -> bool:
    """The multi-tensor Adam/AdamW step; False (nothing done) where it would not be exact."""
    work = []
    for group in opt.param_groups:
        if not _adam_group_ok(group):
            return False
        gathered = _gather(group)
        if gathered is None:
            return False
        work.append((group, *gathered))
    state_of = opt.state
    for group, params, grads in work:
        if not params:
            continue
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in params:
            state = state_of[p]
            if len(state) == 0:
                # exactly torch.optim.Adam._init_group's state, so state_dict()s agree
                state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        weight_decay = group["weight_decay"]
        eps = group["eps"]
        torch._foreach_add_(steps, 1)
        if weight_decay != 0:
            if group["decoupled_weight_decay"]:
                torch._foreach_mul_(params, 1 - lr * weight_decay)
            else:
                grads = list(torch._foreach_add(grads, params, alpha=weight_decay))
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        bias_sqrt, neg_step_size = [], []
        for step_t in steps:
            step = step_t.item()
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            neg_step_size.append(-(lr / bias_correction1))
            bias_sqrt.append(bias_correction2**0.5)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, neg_step_size)
    return True


def _sgd_group_ok(group: dict[str, Any]) -> bool:
    return (
        not group["foreach"]
        and not group["fused"]
        and not group["maximize"]
        and not group["differentiable"]
        and isinstance(group["lr"], float | int)
        and isinstance(group["weight_decay"], float | int)
        and isinstance(group["momentum"], float | int)
        and isinstance(group["dampening"], float | int)
    )


def _sgd_step(opt: _topt.SGD) -> bool:
    work = []
    for group in opt.param_groups:
        if not _sgd_group_ok(group):
            return False
        gathered = _gather(group)
        if gathered is None:
            return False
        work.append((group, *gathered))
    state_of = opt.state
    for group, params, grads in work:
        if not params:
            continue
        lr = group["lr"]
        weight_decay = group["weight_decay"]
        momentum = group["momentum"]
        if weight_decay != 0:
            grads = list(torch._foreach_add(grads, params, alpha=weight_decay))
        if momentum != 0:
            bufs: list[Any] = []
            old_bufs, old_grads = [], []
            for p, g in zip(params, grads):
                state = state_of[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = g.detach().clone()
                    state["momentum_buffer"] = buf
                else:
                    old_bufs.append(buf)
                    old_grads.append(g)
                bufs.append(buf)
            if old_bufs:
                torch._foreach_mul_(old_bufs, momentum)
                torch._foreach_add_(old_bufs, old_grads, alpha=1 - group["dampening"])
            grads = list(torch._foreach_add(grads, bufs, alpha=momentum)) if group["nesterov"] else bufs
        torch._foreach_add_(params, grads, alpha=-lr)
    return True


def _step(opt: Any, closure: Any, fast: Any, torch_cls: type) -> Any:
    if opt._fast_ok(closure):
        with torch.no_grad():
            if fast(opt):
                return None
    return _torch_step(torch_cls)(opt, closure)


class Adam(_Fast, _topt.Adam):
    __doc__ = _topt.Adam.__doc__

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return _step(self, closure, _adam_step, _topt.Adam)

    step.hooked = True  # type: ignore[attr-defined]  # hooks are honoured by the fallback


class AdamW(_Fast, _topt.AdamW):
    __doc__ = _topt.AdamW.__doc__

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return _step(self, closure, _adam_step, _topt.AdamW)

    step.hooked = True  # type: ignore[attr-defined]


class SGD(_Fast, _topt.SGD):
    __doc__ = _topt.SGD.__doc__

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return _step(self, closure, _sgd_step, _topt.SGD)

    step.hooked = True  # type: ignore[attr-defined]
