"""The native decision of a cached ``nn.Sequential`` entry: one prepared-program call per forward.

Where an installed engine offers prepared programs through tb-core's interface
(``Engine.prepare``, ``torchburn.interop``; today ``native_cpu`` from tb-cpu-rust), an entry of a
Sequential made only of ``Linear`` and ``ReLU``, called on a 2-D float32 CPU tensor with no
autograd graph to record, may run the whole stack as one prepared program (for native_cpu: GEMM
with the ReLU in its epilogue, the next GEMM, one FFI call with the GIL released) instead of one
ATen call per layer. Whether it does is decided per entry, that is per dispatch key, by timing
both paths on the entry's own calls; the decision lives in the entry and ``cache_info()`` counts
the entries that run natively. No engine package is imported here: the program comes from
``engine.prepare(plan)`` on a tb-core ``Plan`` and runs with ``program.run(tensors)``.

Numerics: a native GEMM sums in another order than PyTorch's BLAS, so a native entry's result
differs from eager PyTorch by float32 reassociation (a few ulps of each dot product; the tests
hold it to ``rtol=1e-5, atol=1e-5``). ReLU is exact. ``set_native_enabled(False)`` (or
``turbo_torch.set_native_enabled(False)``) keeps every call on the bit-identical ATen path.

A native call is made only when PyTorch would record nothing and observe nothing: grad mode off
(or, for an entry made while no parameter required grad, neither the input nor a parameter
requiring grad), no hook on the container or a child, no
``__torch_function__`` or ``__torch_dispatch__`` mode, profiler off, not tracing. Parameters are
read live on every call (their values may change freely); a parameter whose shape, strides,
dtype or device no longer match what the program was prepared for makes the program refuse it
(``ValueError``), and the entry prepares anew and decides again. Without such an engine every
entry stays on ATen.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch

from tb_cython_dispatch import resolve

# states of a NativeSeq
COLD, TRIAL, NATIVE, TORCH, OFF = range(5)
HOT_AFTER = 3  # calls of an entry before it prepares a program (one-off signatures never pay for one)
WARMUP = 2  # untimed calls of each path at the start of a trial
SAMPLES = 5  # timed calls of each path; the decision compares the fastest of each
MARGIN = 0.95  # native must beat ATen's fastest by 5% to be chosen

_F32 = torch.float32
_perf = time.perf_counter_ns
_fn_mode = torch._C._is_torch_function_mode_enabled
_dispatch_depth = torch._C._len_torch_dispatch_stack
_profiling = torch._C._autograd._profiler_enabled

STALE = object()  # what native_fast returns when the program no longer fits the parameters
# "native": the engine whose programs are used (None: not looked up yet; False: there is none);
# "unary": op -> that engine's eager kernel (None: not looked up yet; see native_unary)
_state: dict[str, Any] = {"enabled": True, "native": None, "reason": "", "unary": None}
_live: weakref.WeakSet[Any] = weakref.WeakSet()  # every NativeSeq and NativeUnary, for counts()


def set_native_enabled(enabled: bool) -> None:
    """False: every entry stays on the ATen path (bit-identical to PyTorch); True: decide by timing."""
    _state["enabled"] = bool(enabled)


def native_enabled() -> bool:
    return bool(_state["enabled"])


def native_available() -> tuple[bool, str]:
    """(True, "engine <name>") when an installed engine offers prepared programs, else (False, why)."""
    engine = _load()
    return engine is not None, str(_state["reason"])


def _load() -> Any:
    """The highest-priority available CPU engine that offers prepared programs, or None."""
    engine = _state["native"]
    if engine is None:
        try:
            from torchburn.interop import engines_with

            found = [e for e in engines_with("prepare", device="cpu") if e.name != "cython_dispatch"]
        except Exception as exc:  # a plugin state that cannot load: ATen it is
            found, why = [], f"engine lookup failed: {type(exc).__name__}: {exc}"
        else:
            why = "no installed engine offers prepared programs (pip install tb-cpu-rust for native_cpu)"
        engine = _state["native"] = found[0] if found else False
        _state["reason"] = f"engine {found[0].name}" if found else why
    return engine or None


def counts(epoch: int) -> dict[str, int]:
    """op -> number of live entries (of this cache epoch) whose decision is native."""
    out: dict[str, int] = {}
    for nat in list(_live):
        if nat.state == NATIVE and nat.epoch == epoch:
            out[nat.op] = out.get(nat.op, 0) + 1
    return out


def for_entry(op: str, epoch: int, key: Any, steps: tuple[Any, ...]) -> NativeSeq | None:
    """The native slot of a new Sequential entry, or None when the entry can never run natively."""
    if not _state["enabled"] or _state["native"] is False:
        return None
    (shape, _stride, dtype, device, requires_grad), grad_enabled, inference = key
    if dtype is not _F32 or device.type != "cpu" or len(shape) != 2 or shape[0] == 0:
        return None
    if requires_grad and grad_enabled and not inference:
        return None  # the input's graph must be recorded
    layers: list[tuple[Any, bool]] = []  # (linear child, relu after it)
    for step in steps:
        kind = step[0]
        if kind in (resolve.K_LINEAR, resolve.K_LINEAR_RELU):
            layers.append((step[1], kind == resolve.K_LINEAR_RELU))
        elif kind == resolve.K_UNARY_ARG and step[2] is resolve._relu_sel and layers and not layers[-1][1]:
            layers[-1] = (layers[-1][0], True)
        else:
            return None
    if not layers:
        return None
    grad_possible = bool(grad_enabled and not inference)
    if grad_possible:
        # Training-style calls record a graph on every call: such an entry never runs natively, and
        # pays nothing for the option (an entry is per grad mode, so no_grad calls get their own).
        for child, _ in layers:
            if any(p is not None and p.requires_grad for p in child._parameters.values()):
                return None
    return NativeSeq(op, epoch, key, tuple(child for child, _ in steps_children(steps)), layers, grad_possible)


def steps_children(steps: tuple[Any, ...]) -> list[tuple[Any, Any]]:
    """(child, step) of every child module a step list touches (a fused step touches two)."""
    out = []
    for step in steps:
        out.append((step[1], step))
        if step[0] == resolve.K_LINEAR_RELU:
            out.append((step[3], step))
    return out


class NativeSeq:
    """The native half of one Sequential entry: its prepared program and its decision."""

    def __init__(
        self, op: str, epoch: int, key: Any, children: tuple[Any, ...], layers: list[tuple[Any, bool]], grad: bool
    ) -> None:
        self.op = op
        self.epoch = epoch
        self.shape = tuple(key[0][0])
        self.stride = tuple(key[0][1])
        self.children = children  # every module whose hooks would make the call observable
        self.linears = tuple(child for child, _ in layers)
        self.relus = tuple(relu for _, relu in layers)
        self.grad = grad  # grad mode on: native only while no parameter requires grad
        self.state = COLD
        self.calls = 0
        self.program: Any = None  # the engine's torchburn.interop.PreparedProgram
        self.out_shape: tuple[int, ...] = ()
        self.t_native: list[int] = []
        self.t_torch: list[int] = []
        self.prepares = 0
        # Set while the decision is NATIVE: what the implementations' native_fast() needs, as one tuple
        # (program.run, linears, children, out_shape, x_shape, x_stride, grad, out_stride). The program
        # checks every tensor against the layouts it was prepared for: a call whose parameters differ
        # from them is refused (ValueError), which makes the entry STALE and prepare anew.
        self.fast: tuple[Any, ...] | None = None
        self._fast_parts: tuple[Any, ...] = ()  # the same tuple, from prepare() on (the trial uses it)
        _live.add(self)

    # -- what a call may do --------------------------------------------------------------------
    def observed(self, hooks_free: Any) -> bool:
        """True when running natively would hide something from PyTorch's machinery."""
        if _fn_mode() or _dispatch_depth() or _profiling():
            return True
        return any(not hooks_free(child) for child in self.children)

    def params(self) -> list[Any] | None:
        """The current parameters, in program input order, or None if one is not a plain CPU f32 tensor."""
        out = []
        for child in self.linears:
            d = child.__dict__
            if "weight" in d or "bias" in d:
                return None
            p = child._parameters
            w = p.get("weight")
            if w is None:
                return None
            out.append(w)
            b = p.get("bias")
            if b is not None:
                out.append(b)
        for t in out:
            if t.dtype is not _F32 or not t.is_cpu or (self.grad and t.requires_grad) or t.layout is not torch.strided:
                return None
        return out

    # -- preparing -------------------------------------------------------------------------------
    def prepare(self, params: list[Any]) -> bool:
        """Prepare the stack for these parameters' layouts; False (and state OFF) when it cannot run natively."""
        engine = _load()
        if engine is None:
            self.state = OFF
            return False
        try:
            plan, out_shape = _build_plan(self.shape, self.stride, self.linears, self.relus, params)
            program = engine.prepare(plan)
        except Exception:  # a shape the engine does not take: ATen it is
            program = None
        if program is None:
            self.state = OFF
            return False
        self.program = program
        self.out_shape = out_shape
        self.prepares += 1
        self.t_native, self.t_torch = [], []
        self.state = TRIAL
        self.fast = None
        self._fast_parts = (
            program.run,
            self.linears,
            self.children,
            out_shape,
            self.shape,
            self.stride,
            self.grad,
            (out_shape[1], 1),
        )
        return True

    def stale(self) -> None:
        """The native call refused the current parameters: prepare anew on the next call."""
        self.fast = None
        self.state = COLD
        self.calls = HOT_AFTER

    # -- running ---------------------------------------------------------------------------------
    def call(self, x: Any, steps: tuple[Any, ...], run_steps: Any, hooks_free: Any, native_fast: Any) -> Any:
        """The entry's forward while it is COLD or in its TRIAL: ATen, or native, timed."""
        if self.state == COLD:
            self.calls += 1
            if self.calls < HOT_AFTER or self.observed(hooks_free):
                return run_steps(steps, x)
            params = self.params()
            if params is None:
                self.state = TORCH  # not natively runnable now: this entry keeps to ATen
                return run_steps(steps, x)
            if not self.prepare(params):
                return run_steps(steps, x)
        elif self.state != TRIAL:
            return run_steps(steps, x)
        # TRIAL: alternate the two paths, time each, decide once both have their samples.
        if len(self.t_native) <= len(self.t_torch):
            t0 = _perf()
            y = native_fast(self._fast_parts, x)
            if y is None or y is STALE:
                if y is STALE:
                    self.stale()
                return run_steps(steps, x)
            self.t_native.append(_perf() - t0)
        else:
            t0 = _perf()
            y = run_steps(steps, x)
            self.t_torch.append(_perf() - t0)
        if len(self.t_torch) >= WARMUP + SAMPLES and len(self.t_native) >= WARMUP + SAMPLES:
            self.state = decide(min(self.t_native[WARMUP:]), min(self.t_torch[WARMUP:]))
            self.fast = self._fast_parts if self.state == NATIVE else None
        return y


def decide(native_ns: int, torch_ns: int) -> int:
    """NATIVE when the native program's fastest call beats ATen's fastest by the margin."""
    return NATIVE if native_ns < torch_ns * MARGIN else TORCH


def _build_plan(
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    linears: tuple[Any, ...],
    relus: tuple[bool, ...],
    params: list[Any],
) -> tuple[Any, tuple[int, ...]]:
    """x -> [addmm|mm (+relu)]* as a tb-core plan, with the output shape."""
    from torchburn.plan import Plan, PlanNode, Ref, TensorMeta, resolve_op

    def meta(s: tuple[int, ...], st: tuple[int, ...]) -> TensorMeta:
        return TensorMeta(tuple(s), tuple(st), _F32, "cpu")

    def contig(s: tuple[int, ...]) -> tuple[int, ...]:
        return (s[1], 1)

    inputs: list[Any] = [meta(shape, stride)]
    for t in params:
        inputs.append(meta(tuple(t.shape), tuple(t.stride())))
    nodes: list[Any] = []
    n_in = len(inputs)

    def add(op: str, args: tuple[Any, ...], out: TensorMeta) -> Ref:
        nodes.append(PlanNode(op, args, {}, out, resolve_op(op)))
        return Ref(n_in + len(nodes) - 1)

    cur, rows = Ref(0), shape[0]
    slot = 1
    for child, relu in zip(linears, relus):
        w_slot = slot
        slot += 1
        has_bias = child._parameters.get("bias") is not None
        w = inputs[w_slot]
        out_f, in_f = w.shape
        wt = add("aten.t.default", (Ref(w_slot),), meta((in_f, out_f), (w.stride[1], w.stride[0])))
        out_meta = meta((rows, out_f), contig((rows, out_f)))
        if has_bias:
            cur = add("aten.addmm.default", (Ref(slot), cur, wt), out_meta)
            slot += 1
        else:
            cur = add("aten.mm.default", (cur, wt), out_meta)
        if relu:
            cur = add("aten.relu.default", (cur,), out_meta)
    return Plan(inputs, nodes, [cur], {}, True), (rows, nodes[-1].out.shape[1])


def reset_for_tests() -> None:
    """Forget which engine was found (tests that add or hide one)."""
    _state["native"] = None
    _state["reason"] = ""
    _state["unary"] = None
