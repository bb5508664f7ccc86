"""The native decision of a cached unary call: ``turbo_torch.sin(x)``, ``cos``, ``tanh``.

Each of those goes through a dispatch site per op whose key is the element count of the input.
Where an installed engine offers an eager float32 kernel for the op through tb-core's interface
(``Engine.eager_kernel``, ``torchburn.interop``; today ``native_cpu``'s AVX2 kernels from
tb-cpu-rust: no plan, no descriptors, the GIL released from 64K elements on), an entry may run
the op as one call of that kernel, which returns a fresh tensor — instead of PyTorch's
dispatcher, TensorIterator and kernel. Whether it does is decided per entry, by timing both
paths on the entry's own calls (as ``tb_cython_dispatch.native`` does for ``Sequential``).

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
profiler off, not tracing, and no ``out=``. Anything else is the torch function itself, and so
is a call the kernel refuses (``ValueError`` / ``TypeError``, its contract for inputs it does not take).

Numerics: the engine's (native_cpu: polynomial approximations within float32 tolerance of
``torch.testing.assert_close``, NaN, ±inf and signed zeros as in PyTorch), not bit-identical.
``turbo_torch.set_native_enabled(False)`` keeps every call on PyTorch's kernel.
"""

from __future__ import annotations

from typing import Any

from tb_cython_dispatch import native

OPS = ("sin", "cos", "tanh")  # the torch functions turbo_torch wraps


def kernels() -> dict[str, Any]:
    """op ("sin") -> the eager float32 kernel of the highest-priority CPU engine offering one."""
    found = native._state["unary"]
    if found is None:
        found = {}
        try:
            import torch

            from torchburn.interop import engines_with

            engines = [e for e in engines_with("eager_kernel", device="cpu") if e.name != "cython_dispatch"]
            for op in OPS:
                for engine in engines:
                    fn = engine.eager_kernel(f"aten.{op}.default", torch.float32)
                    if fn is not None:
                        found[op] = fn
                        break
        except Exception:  # a plugin state that cannot load: PyTorch's kernels it is
            found = {}
        native._state["unary"] = found
    return found  # type: ignore[no-any-return]


class NativeUnary:
    """The native half of one unary entry (one op, one element count): its decision."""

    __slots__ = ("__weakref__", "calls", "epoch", "kernel", "op", "state", "t_native", "t_torch")

    def __init__(self, op: str, epoch: int, kernel: Any) -> None:
        self.op = op
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
            y = run_native(self.kernel, x, torch_fn)
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
    fn = kernels().get(op)
    if fn is None:
        return None
    return NativeUnary(f"torch.{op}", epoch, fn)
