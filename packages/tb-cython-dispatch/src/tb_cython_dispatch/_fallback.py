"""Pure-Python implementation of ``tb_cython_dispatch._dispatch`` (same API, same behaviour).

Used where the extension is not built (an sdist installed without a compiler, or
``TORCHBURN_DISPATCH_IMPL=python``). The test suite runs against this module and the compiled
one alike. Keep the two in step: a change here is a change in ``_dispatch.pyx``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.modules.module as _module_mod

from tb_cython_dispatch import native as _native_mod

IMPLEMENTATION = "python"

_Tensor = torch.Tensor
_strided = torch.strided
_is_grad_enabled = torch.is_grad_enabled
_is_inference = torch.is_inference_mode_enabled
_is_tracing = torch._C._is_tracing
_G = _module_mod.__dict__
_linear = torch._C._nn.linear
_relu_ = torch.relu_

K_CALL, K_LINEAR, K_LINEAR_RELU, K_UNARY, K_UNARY_ARG, K_IDENTITY = range(6)


class OpStats:
    __slots__ = ("entries", "hits", "invalidations", "misses")

    def __init__(self) -> None:
        self.hits = self.misses = self.entries = self.invalidations = 0

    def as_dict(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "entries": self.entries, "invalidations": self.invalidations}


class DispatchCache:
    def __init__(self, enabled: bool = True, max_entries_per_site: int = 8) -> None:
        self.enabled = enabled
        self.epoch = 0
        self.max_entries_per_site = max_entries_per_site
        self._stats: dict[str, OpStats] = {}

    def stats(self, op: str) -> OpStats:
        s = self._stats.get(op)
        if s is None:
            s = self._stats[op] = OpStats()
        return s

    def info(self) -> dict[str, dict[str, int]]:
        native = _native_mod.counts(self.epoch)
        return {
            op: {**s.as_dict(), "native": native.get(op, 0)}
            for op, s in sorted(self._stats.items())
            if s.hits or s.misses or s.entries or s.invalidations  # sites never called are not listed
        }

    def clear(self) -> None:
        self.epoch += 1
        self._stats = {}


CACHE = DispatchCache()


class Site:
    __slots__ = ("epoch", "last_entry", "last_key", "op", "resolver", "stats", "table")

    def __init__(self, op: str, resolver: Callable[[Any, Any], Any]) -> None:
        self.op = op
        self.resolver = resolver
        self.last_key: Any = None
        self.last_entry: Any = None
        self.table: dict[Any, Any] = {}
        self.epoch = CACHE.epoch
        self.stats = CACHE.stats(op)

    def lookup(self, owner: Any, key: Any) -> Any:
        if self.epoch != CACHE.epoch:
            self._reset()
        if self.last_key is not None and (self.last_key is key or self.last_key == key):
            self.stats.hits += 1
            return self.last_entry
        entry = self.table.get(key)
        if entry is not None:
            self.stats.hits += 1
        else:
            self.stats.misses += 1
            entry = self.resolver(owner, key)
            if len(self.table) >= CACHE.max_entries_per_site:
                self.table.pop(next(iter(self.table)))
                self.stats.invalidations += 1
                self.stats.entries -= 1
            self.table[key] = entry
            self.stats.entries += 1
        self.last_key = key
        self.last_entry = entry
        return entry

    def invalidate(self) -> None:
        self.stats.invalidations += len(self.table)
        self.stats.entries -= len(self.table)
        self.table.clear()
        self.last_key = None
        self.last_entry = None

    def _reset(self) -> None:
        self.stats = CACHE.stats(self.op)
        self.table.clear()
        self.last_key = None
        self.last_entry = None
        self.epoch = CACHE.epoch

    def __len__(self) -> int:
        return len(self.table)

    def __del__(self) -> None:
        try:
            if self.epoch == CACHE.epoch:
                self.stats.entries -= len(self.table)
        except Exception:  # interpreter shutdown
            pass


def tensor_key(x: Any) -> Any:
    if type(x) is not _Tensor or x.layout is not _strided:
        return None
    return (x.shape, x.stride(), x.dtype, x.device, x.requires_grad)


def call_key(x: Any) -> Any:
    tk = tensor_key(x)
    if tk is None:
        return None
    return (tk, _is_grad_enabled(), _is_inference())


def hooks_free(module: Any) -> bool:
    d = module.__dict__
    return not (
        d.get("_forward_hooks")
        or d.get("_forward_pre_hooks")
        or d.get("_backward_hooks")
        or d.get("_backward_pre_hooks")
        or d.get("_compiled_call_impl") is not None
        or "forward" in d
    )


def _globals_free() -> bool:
    return not (
        _G["_global_forward_hooks"]
        or _G["_global_forward_pre_hooks"]
        or _G["_global_backward_hooks"]
        or _G["_global_backward_pre_hooks"]
    )


def fast_ok(module: Any) -> bool:
    return CACHE.enabled and _globals_free() and not _is_tracing() and hooks_free(module)


def run_steps(steps: tuple[Any, ...], x: Any) -> Any:
    for step in steps:
        kind = step[0]
        child = step[1]
        if kind == K_CALL:
            x = child(x)
        elif kind == K_LINEAR_RELU:
            params = step[2]
            w = params.get("weight")
            if (
                w is None
                or not hooks_free(child)
                or not hooks_free(step[3])
                or "weight" in child.__dict__
                or "bias" in child.__dict__
            ):
                x = step[3](child(x))
            else:
                x = _relu_(_linear(x, w, params.get("bias")))
        elif not hooks_free(child):
            x = child(x)
        elif kind == K_LINEAR:
            params = step[2]
            w = params.get("weight")
            if w is None or "weight" in child.__dict__ or "bias" in child.__dict__:
                x = child(x)
            else:
                x = _linear(x, w, params.get("bias"))
        elif kind == K_UNARY:
            x = step[2](x)
        elif kind == K_UNARY_ARG:
            x = step[2](x, child.__dict__[step[3]])
    return x


T_FORWARD, T_LINEAR, T_UNARY, T_UNARY_ATTR, T_SEQUENTIAL = range(5)
_NAT = _native_mod._state
_NAT_DECIDED_TORCH = _native_mod.TORCH  # states below it may run natively (COLD, TRIAL, NATIVE)
_TYPES: dict[type, tuple[Any, ...]] = {}
_resolvers: list[Any] = [None, None]
_generic_call = torch.nn.Module.__call__
SITE_ATTR = "_tb_site_python"


def set_resolvers(resolve_type: Any, resolve_sequential: Any) -> None:
    _resolvers[:] = [resolve_type, resolve_sequential]
    _TYPES.clear()


def module_call(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not (CACHE.enabled and _globals_free() and not _is_tracing() and hooks_free(module)):
        return _generic_call(module, *args, **kwargs)
    cls = type(module)
    handler = _TYPES.get(cls)
    if handler is None:
        handler = _TYPES[cls] = _resolvers[0](cls)
    kind = handler[0]
    if kind == T_FORWARD or kwargs or len(args) != 1:
        return module.forward(*args, **kwargs)
    x = args[0]
    if kind == T_LINEAR:
        params = module._parameters
        w = params.get("weight")
        if w is None or "weight" in module.__dict__ or "bias" in module.__dict__:
            return module.forward(x)
        return _linear(x, w, params.get("bias"))
    if type(x) is not _Tensor:  # a subclass may override __torch_function__: keep its forward
        return module.forward(x)
    if kind == T_UNARY:
        return handler[1](x)
    if kind == T_UNARY_ATTR:
        return handler[1](x, module.__dict__[handler[2]])
    key = call_key(x)
    if key is None:
        return module.forward(x)
    site = module.__dict__.get(SITE_ATTR)
    if site is None:
        site = module.__dict__[SITE_ATTR] = Site("nn.Sequential", _resolvers[1])
    children = tuple(module._modules.values())
    entry = site.lookup(module, key)
    if entry[0] != children or entry[1] != tuple([type(c) for c in children]):
        site.invalidate()
        entry = site.lookup(module, key)
    nat = entry[3]
    if nat is not None and _NAT["enabled"]:
        fast = nat.fast
        if fast is not None:
            y = native_fast(fast, x)
            if y is _STALE:
                nat.stale()
            elif y is not None:
                return y
        elif nat.state < _NAT_DECIDED_TORCH:
            return nat.call(x, entry[2], run_steps, hooks_free, native_fast)
    return run_steps(entry[2], x)


# -- the native decision of a Sequential entry (tb_cython_dispatch.native) ----------------------
_f32 = torch.float32
_fn_mode = torch._C._is_torch_function_mode_enabled
_dispatch_depth = torch._C._len_torch_dispatch_stack
_profiling = torch._C._autograd._profiler_enabled
_STALE = _native_mod.STALE


def native_fast(parts: tuple[Any, ...], x: Any) -> Any:
    """One native call of a prepared Sequential entry; None when PyTorch would observe or record
    something (then the caller runs the ATen steps), STALE when the parameters no longer fit."""
    run, linears, children, _out_shape, _x_shape, _x_stride, grad, _out_stride = parts
    if _fn_mode() or _dispatch_depth() or _profiling():
        return None
    for child in children:
        if not hooks_free(child):
            return None
    # The program (torchburn.interop.PreparedProgram) checks every tensor's layout against the one
    # it was prepared for and refuses a mismatch with ValueError: the entry then prepares anew.
    tensors = [x]
    for child in linears:
        d = child.__dict__
        if "weight" in d or "bias" in d:
            return None
        params = d["_parameters"]
        t = params.get("weight")
        if t is None or (grad and t.requires_grad):
            return None
        tensors.append(t)
        t = params.get("bias")
        if t is not None:
            if grad and t.requires_grad:
                return None
            tensors.append(t)
    try:
        return run(tensors)[0]
    except ValueError:
        return _STALE


class PlanRunner:
    def __init__(
        self,
        steps: list[tuple[Any, ...]],
        n_slots: int,
        n_inputs: int,
        constants: tuple[Any, ...],
        out_kinds: tuple[int, ...],
        out_values: tuple[Any, ...],
        single: bool,
    ) -> None:
        self._steps = steps
        self._n_slots = n_slots
        self._n_inputs = n_inputs
        self._constants = constants
        self._out_kinds = out_kinds
        self._out_values = out_values
        self._single = single

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != self._n_inputs:
            raise TypeError(f"this compiled partition takes {self._n_inputs} inputs, got {len(inputs)}")
        values: list[Any] = [None] * self._n_slots
        values[: self._n_inputs] = inputs
        n = self._n_inputs
        values[n : n + len(self._constants)] = self._constants
        n += len(self._constants)
        for fn, kinds, vals, kw_names, kw_kinds, kw_vals, release in self._steps:
            args = [_bind(k, v, values) for k, v in zip(kinds, vals)]
            if kw_names:
                kwargs = {name: _bind(k, v, values) for name, k, v in zip(kw_names, kw_kinds, kw_vals)}
                values[n] = fn(*args, **kwargs)
            else:
                values[n] = fn(*args)
            for slot in release:
                values[slot] = None
            n += 1
        if self._single:
            return _bind(self._out_kinds[0], self._out_values[0], values)
        return tuple(_bind(k, v, values) for k, v in zip(self._out_kinds, self._out_values))


def _bind(kind: int, value: Any, values: list[Any]) -> Any:
    if kind == 0:
        return value
    if kind == 1:
        return values[value]
    out = [_bind(k, v, values) for k, v in value]
    return out if kind == 2 else tuple(out)


# -- unary functions (turbo_torch.sin & co., tb_cython_dispatch.native_unary) -------------------
_functorch_active = torch._C._are_functorch_transforms_active
_fwd_ad = torch.autograd.forward_ad
_NAMED = hasattr(torch.Tensor, "has_names")  # named tensors (gone in newer torch)
_NAT_NATIVE = _native_mod.NATIVE


def unary_native(kernel: Any, x: Any, fn: Any) -> Any:
    """op(x) by the engine's eager kernel (a fresh tensor); ``fn(x)`` if the kernel refuses x."""
    try:
        return kernel(x)
    except (ValueError, TypeError):
        return fn(x)


def unary_call(site: Site, fn: Any, x: Any) -> Any:
    """``fn(x)`` for a torch unary function, natively when the call's entry decided so.

    The entry (by element count) is looked up first, so a signature decided for PyTorch pays
    only that lookup; the full "nothing would observe this" check runs only before native calls.
    """
    if not CACHE.enabled or type(x) is not _Tensor or _is_tracing():  # traced: numel() is a tensor
        return fn(x)
    nat = site.lookup(None, x.numel())[0]
    if nat is None:
        return fn(x)
    state = nat.state
    if state >= _NAT_DECIDED_TORCH or not _NAT["enabled"]:
        return fn(x)
    if (
        (x.requires_grad and _is_grad_enabled())
        or x.dtype is not _f32
        or x.layout is not _strided
        or not x.is_cpu
        or not x.is_contiguous()
        or x.is_neg()
        or (_NAMED and x.has_names())  # type: ignore[attr-defined]
        or _fn_mode()
        or _dispatch_depth()
        or _profiling()
        or _functorch_active()
        or _fwd_ad._current_level >= 0
    ):
        return fn(x)
    if state == _NAT_NATIVE:
        return unary_native(nat.kernel, x, fn)
    return nat.call(x, fn, unary_native)
