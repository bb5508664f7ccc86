"""NativeProgram: the callable a compiled partition becomes; PreparedNativeProgram: the same
program as ``NativeCpuEngine.prepare`` hands it to other engines (``torchburn.interop``).

Per call: allocate the output buffers with ``torch.empty`` (only those whose values leave the
partition) and make one call into Rust with the GIL released, passing the tensors
(``Executor.run``): Rust reads each tensor's own description, checks its dtype, sizes and strides
against the plan's and raises the precise error when one does not match. Outputs that are views
are made with ``as_strided``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import torch

from tb_cpu_rust import _native
from tb_cpu_rust.lower import lower
from tb_cpu_rust.threads import use_torch_openmp
from torchburn.interop import PreparedProgram, check_no_overlap, check_tensors
from torchburn.plan import Plan

use_torch_openmp()

_DT = {
    "float32": torch.float32,
    "int64": torch.int64,
    "bool": torch.bool,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
    "complex32": torch.complex32,
}


class NativeProgram:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        lowered = lower(plan)
        self.executor = _native.Executor(lowered["json"])
        self._constants = [plan.constants[k] for k in sorted(plan.constants)]
        self._n_user_inputs = len(plan.inputs) - len(plan.constants)
        buffers, values = lowered["buffers"], lowered["values"]
        n_in = lowered["n_inputs"]
        self._out_bufs = [(b["numel"], _DT[b["dtype"]]) for b in buffers[n_in : n_in + self.executor.n_outputs]]
        # how each plan output is made: from an output buffer, an input, or a literal
        self._outputs: list[tuple[str, Any]] = []
        for kind, v in lowered["outputs"]:
            if kind == "lit":
                self._outputs.append(("lit", v))
                continue
            val = values[v]
            b = val["buf"]
            shape, stride, off = tuple(val["sizes"]), tuple(val["strides"]), val["offset"]
            if b < n_in:
                self._outputs.append(("in", (b, shape, stride, off)))
            else:
                whole = off == 0 and _extent(shape, stride) == buffers[b]["numel"]
                self._outputs.append(("out", (b - n_in, shape, stride, off, whole)))
        # an output buffer that backs exactly one whole output is allocated with its strides
        self._direct: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        users: dict[int, int] = {}
        for kind, spec in self._outputs:
            if kind == "out":
                users[spec[0]] = users.get(spec[0], 0) + 1
        for kind, spec in self._outputs:
            if kind == "out" and spec[4] and users[spec[0]] == 1:
                self._direct[spec[0]] = (spec[1], spec[2])
        self._alloc = [(spec, self._direct.get(i)) for i, spec in enumerate(self._out_bufs)]
        self.single = plan.single_output
        # each input tensor's dtype, sizes and strides as the plan has them (PreparedNativeProgram's checks)
        self._layouts = [(_DT[b["dtype"]], tuple(b["sizes"]), tuple(b["strides"])) for b in buffers[:n_in]]
        # the executor reads memory as it is: a complex input with its conjugate (or negative) bit set
        # would be read unconjugated, so such calls are refused (tb-core then runs the graph eagerly)
        self._complex_in = any(b["dtype"].startswith("complex") for b in buffers[:n_in])

    def __call__(self, *inputs: Any) -> Any:
        tensors = [*inputs, *self._constants]
        if self._complex_in and any(isinstance(t, torch.Tensor) and (t.is_conj() or t.is_neg()) for t in tensors):
            raise RuntimeError("native_cpu: a complex input is a lazy conjugate view; pass t.resolve_conj()")
        bufs = [
            torch.empty_strided(direct[0], direct[1], dtype=dtype) if direct else torch.empty(numel, dtype=dtype)
            for (numel, dtype), direct in self._alloc
        ]
        _run(self.executor, tensors, bufs)
        result = []
        for kind, spec in self._outputs:
            if kind == "lit":
                result.append(spec)
            elif kind == "in":
                b, shape, stride, off = spec
                t = tensors[b]
                result.append(t.as_strided(shape, stride, t.storage_offset() + off))
            else:
                b, shape, stride, off, _ = spec
                buf = bufs[b]
                result.append(buf if b in self._direct else buf.as_strided(shape, stride, off))
        return result[0] if self.single else tuple(result)


class PreparedNativeProgram(PreparedProgram):
    """A NativeProgram as ``torchburn.interop.PreparedProgram``: every tensor checked, then one call.

    When every output of the plan is one whole output buffer of the executor laid out as the
    plan's output meta (the usual case), ``run`` allocates exactly those buffers and ``run_into``
    hands the caller's outputs to the executor: one native call, no copy. Otherwise the program
    runs into its own buffers and copies into the outputs.
    """

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        prog = self.program = NativeProgram(plan)
        self._executor = prog.executor
        self._constants = prog._constants
        self._in_layouts = prog._layouts
        self._in_extents = [_extent(sizes, strides) * _itemsize(dt) for dt, sizes, strides in prog._layouts]
        self._out_layouts = [(m.dtype, m.shape, m.stride) for m in self.output_metas]
        self._out_extents = [_extent(m.shape, m.stride) * _itemsize(m.dtype) for m in self.output_metas]
        self._complex_in = prog._complex_in
        # executor output buffer b <- plan output order[b], when each output is its own direct buffer
        order: list[int] = [-1] * len(prog._out_bufs)
        for index, (kind, spec) in enumerate(prog._outputs):
            if kind != "out" or spec[0] not in prog._direct or order[spec[0]] != -1:
                break
            meta = self.output_metas[index]
            shape, stride = prog._direct[spec[0]]
            if shape != meta.shape or any(n > 1 and a != b for n, a, b in zip(shape, stride, meta.stride)):
                break
            order[spec[0]] = index
        else:
            if -1 not in order:
                self._order: list[int] | None = order
                self._identity = order == list(range(len(order)))
                return
        self._order = None
        self._identity = False

    def run(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if not self._identity:
            return super().run(inputs)
        tensors = [*inputs, *self._constants] if self._constants else inputs
        ptrs = _checked_ptrs(tensors, self._in_layouts)
        if ptrs is None or (self._complex_in and _lazy_complex(tensors)):
            self._refuse(inputs, ())
        outputs = tuple(torch.empty_strided(shape, stride, dtype=dtype) for dtype, shape, stride in self._out_layouts)
        _run(self._executor, tensors, outputs)
        return outputs

    def run_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        tensors = [*inputs, *self._constants] if self._constants else inputs
        in_ptrs = _checked_ptrs(tensors, self._in_layouts)
        out_ptrs = _checked_ptrs(outputs, self._out_layouts)
        if in_ptrs is None or out_ptrs is None or (self._complex_in and _lazy_complex(tensors)):
            self._refuse(inputs, outputs)
        # a caller's own output buffers may alias an input or each other; the executor would then
        # read what it already wrote, so that is refused like every other breach of the contract
        if _overlap(in_ptrs, self._in_extents, out_ptrs, self._out_extents):
            self._refuse(inputs, outputs)
        if self._order is not None:
            _run(self._executor, tensors, [outputs[i] for i in self._order])
            return
        result = self.program(*inputs)
        for out, value in zip(outputs, result if isinstance(result, tuple) else (result,)):
            out.copy_(value)

    def _refuse(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> NoReturn:
        """Raise the error that says what about these tensors does not fit the plan."""
        check_tensors("input", inputs, self.input_metas)
        if outputs:
            check_tensors("output", outputs, self.output_metas)
            check_no_overlap(list(inputs), list(outputs))
        raise ValueError("native_cpu: the tensors do not fit the prepared program (a lazily conjugated complex input?)")


def _checked_ptrs(
    tensors: Sequence[Any], layouts: list[tuple[torch.dtype, tuple[int, ...], tuple[int, ...]]]
) -> list[int] | None:
    """Data pointers of ``tensors`` when each is a CPU tensor with exactly its layout, else None."""
    if len(tensors) != len(layouts):
        return None
    ptrs = []
    same = _same_layout
    try:
        for t, (dtype, sizes, strides) in zip(tensors, layouts):
            if t.dtype is not dtype or not t.is_cpu or t.is_neg():
                return None
            same(t, sizes, strides)
            ptrs.append(t.data_ptr())
    except (AttributeError, AssertionError, TypeError, RuntimeError):
        return None
    return ptrs


def _lazy_complex(tensors: Sequence[Any]) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_conj() for t in tensors)


def _overlap(in_ptrs: list[int], in_len: list[int], out_ptrs: list[int], out_len: list[int]) -> bool:
    """True when an output's byte range meets an input's or another output's."""
    for i, (o0, n) in enumerate(zip(out_ptrs, out_len)):
        if not n:
            continue
        for p0, m in zip((*in_ptrs, *out_ptrs[:i]), (*in_len, *out_len[:i])):
            if m and p0 < o0 + n and o0 < p0 + m:
                return True
    return False


def _run(executor: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """One executor call on the tensors themselves; Rust validates each and names what is wrong."""
    try:
        executor.run(inputs, outputs)
    except BaseException as exc:
        _reraise(exc)


def _reraise(exc: BaseException) -> None:
    # a Rust panic arrives as pyo3's PanicException, a BaseException that tb-core's eager
    # fallback (which catches Exception) would not see: make it an ordinary error
    if type(exc).__name__ == "PanicException":
        raise RuntimeError(f"native_cpu kernel panicked: {exc}") from exc
    raise exc


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _same_layout_py(t: Any, sizes: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """Raises AssertionError unless ``t`` has these sizes and (for dims longer than 1) strides."""
    if t.dim() != len(sizes) or tuple(t.shape) != sizes:
        raise AssertionError("sizes differ")
    if any(n > 1 and a != b for n, a, b in zip(sizes, t.stride(), strides)):
        raise AssertionError("strides differ")


try:
    # PyTorch's C check (what inductor's generated code calls on its inputs): sizes equal, and
    # strides equal wherever the size is above 1 — a stride over a dim of size 0 or 1 never
    # multiplies a nonzero index, so the executor reads the same memory either way.
    from torch._C._dynamo.guards import assert_size_stride as _same_layout
except ImportError:  # pragma: no cover - older PyTorch
    _same_layout = _same_layout_py  # type: ignore[assignment]


def _extent(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))
