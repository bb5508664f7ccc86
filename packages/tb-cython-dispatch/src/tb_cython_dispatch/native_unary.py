"""The native decision of a cached unary call: ``turbo_torch.sin(x)``, ``cos``, ``tanh``.

Each of those goes through a dispatch site per op whose key is the element count of the input.
Where tb-cpu-rust is installed, an entry may run the op as one call of tb-cpu-rust's AVX2 kernel
over the contiguous float32 buffer (``tb_cpu_rust._native.unary_f32``: no plan, no descriptors,
the GIL released from 64K elements on) into a fresh ``torch.empty_like(x)`` — instead of
PyTorch's dispatcher, TensorIterator and kernel. Whether it does is decided per entry, by timing
both paths on the entry's own calls (as ``tb_cython_dispatch.native`` does for ``Sequential``).

Only these three are wrapped: on this project's 2-core AVX2 machine they are the unary ops
where PyTorch's CPU kernel is slow enough for a native call to win at small sizes (64×64,
2 threads, one run: tanh 17.4 → 7.1 µs, sin 7.7 → 6.1, cos 11.8 → 6.7;
``benchmarks/bench_cython_dispatch.py``).
For relu, abs, neg, exp, sigmoid and sqrt PyTorch's own call was as fast or faster than the
native one (its allocation alone costs ~2 µs), so wrapping them would only add the lookup.

A native call is made only when PyTorch would record nothing and observe nothing: a plain
``torch.Tensor`` (no subclass), strided, contiguous, float32, on the CPU, no neg bit, no names,
no autograd graph to record (grad mode off, or the input does not require grad), no
``__torch_function__``/``__torch_dispatch__`` mode, no functorch transform or forward-AD level,
profiler off, not tracing, and no ``out=``. Anything else is the torch function itself.

Numerics: polynomial approximations within float32 tolerance of ``torch.testing.assert_close``
(NaN, ±inf and signed zeros as in PyTorch), not bit-identical.
``turbo_torch.set_native_enabled(False)`` keeps every call on PyTorch's kernel.
"""

from __future__ import annotations

from typing import Any

from tb_cython_dispatch import native

OPS = ("sin", "cos", "tanh")  # the torch functions turbo_torch wraps

_unary: dict[str, Any] = {"fn": None, "codes": {}}


def kernel() -> Any:
    """tb_cpu_rust._native.unary_f32, or None when tb-cpu-rust is absent or lacks one of OPS."""
    fn = _unary["fn"]
    if fn is None:
        mod = native._load()
        fn = False
        if mod is not None:
            _native = mod[0]
            ops = getattr(_native, "unary_ops", None)
            codes = {name: i for i, name in enumerate(ops())} if ops is not None else {}
            if all(op in codes for op in OPS):
                fn = _native.unary_f32
                _unary["codes"] = codes
        _unary["fn"] = fn
    return fn or None


class NativeUnary:
    """The native half of one unary entry (one op, one element count): its decision."""

    __slots__ = ("__weakref__", "calls", "code", "epoch", "kernel", "op", "state", "t_native", "t_torch")

    def __init__(self, op: str, code: int, epoch: int, kernel: Any) -> None:
        self.op = op
        self.code = code
        self.epoch = epoch
        self.kernel = kernel
        self.state = native.COLD
        self.calls = 0
        self.t_native: list[int] = []
        self.t_torch: list[int] = []
        native._live.add(self)

    def call(self, x: Any, torch_fn: Any, run_native: Any) -> Any:
        """The call while the entry is COLD or in its TRIAL: PyTorch, or native, timed."""
        if self.state == native.COLD:
            self.calls += 1
            if self.calls < native.HOT_AFTER:
                return torch_fn(x)
            self.state = native.TRIAL
        elif self.state != native.TRIAL:
            return torch_fn(x)
        if len(self.t_native) <= len(self.t_torch):
            t0 = native._perf()
            y = run_native(self.kernel, self.code, x)
            self.t_native.append(native._perf() - t0)
        else:
            t0 = native._perf()
            y = torch_fn(x)
            self.t_torch.append(native._perf() - t0)
        w, s = native.WARMUP, native.SAMPLES
        if len(self.t_torch) >= w + s and len(self.t_native) >= w + s:
            self.state = native.decide(min(self.t_native[w:]), min(self.t_torch[w:]))
        return y


def for_key(op: str, epoch: int) -> NativeUnary | None:
    """The native slot of a new entry of ``op`` ("sin"...; counted in ``cache_info()`` under
    "torch.sin"), or None when it can never run natively."""
    if not native._state["enabled"]:
        return None
    fn = kernel()
    if fn is None:
        return None
    return NativeUnary(f"torch.{op}", _unary["codes"][op], epoch, fn)
