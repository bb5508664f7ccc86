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
    def __init__(self, plan: Plan, lowered: dict[str, Any] | None = None) -> None:
        # ``lowered``: ``lower(plan)`` as the persistent cache stored it (``NativeCpuEngine.deserialize``)
        self.plan = plan
        lowered = lower(plan) if lowered is None else lowered
        self.lowered = lowered
        self.executor = _native.Executor(lowered["json"])
        self._constants = [plan.constants[k] for k in sorted(plan.constants)]
        self._n_user_inputs = len(plan.inputs) - len(plan.constants)
        buffers, values = lowered["buffers"], lowered["values"]
        n_in = lowered["n_inputs"]
        # each output buffer is allocated with the layout the executor checks it against
        self._alloc = [
            (tuple(b["sizes"]), tuple(b["strides"]), _DT[b["dtype"]])
            for b in buffers[n_in : n_in + self.executor.n_outputs]
        ]
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
                self._outputs.append(("out", (b - n_in, shape, stride, off)))
        # an output buffer that is exactly one whole output (the lowering lays it out as that output)
        self._direct = {b - n_in: (tuple(s), tuple(t)) for b, s, t in lowered["direct"]}
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
        bufs = [torch.empty_strided(sizes, strides, dtype=dtype) for sizes, strides, dtype in self._alloc]
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
                b, shape, stride, off = spec
                buf = bufs[b]
                result.append(buf if b in self._direct else buf.as_strided(shape, stride, off))
        return result[0] if self.single else tuple(result)


class PreparedNativeProgram(PreparedProgram):
    """A NativeProgram as ``torchburn.interop.PreparedProgram``: one executor call per run.

    The executor itself checks every input it is handed against the plan (dtype, CPU device,
    sizes, strides, lazy negation / conjugation) before it touches memory, so ``run``, whose
    outputs are its own fresh tensors, makes no Python-side check; a refused call is checked again
    by tb-core's reference checks only to name the tensor in the interface's terms. When every
    output of the plan is one whole output buffer of the executor laid out as the plan's output meta
    (the usual case), ``run`` allocates exactly those buffers and ``run_into`` hands the caller's
    outputs to the executor: no copy. Otherwise the program runs into its own buffers and copies.
    """

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        prog = self.program = NativeProgram(plan)
        self._executor = prog.executor
        self._constants = prog._constants
        self._n_inputs = len(self.input_metas)
        self._out_layouts = [(m.dtype, m.shape, m.stride) for m in self.output_metas]
        # executor output buffer b <- plan output order[b], when each output is its own direct buffer
        order: list[int] = [-1] * len(prog._alloc)
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
        if not self._identity or len(inputs) != self._n_inputs:
            return super().run(inputs)
        tensors = [*inputs, *self._constants] if self._constants else inputs
        outputs = tuple(torch.empty_strided(shape, stride, dtype=dtype) for dtype, shape, stride in self._out_layouts)
        try:
            _run(self._executor, tensors, outputs)
        except (ValueError, TypeError):
            self._refuse(inputs, outputs)
        return outputs

    def run_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        if len(inputs) != self._n_inputs or len(outputs) != len(self._out_layouts):
            self._refuse(inputs, outputs)
        # The executor checks each output's dtype and layout against the plan; tb-core's reference
        # checks name what does not fit in the interface's terms, and check the caller's outputs
        # against any byte of an input (run_into is not a hot path; run is).
        check_tensors("output", outputs, self.output_metas)
        check_no_overlap(list(inputs), list(outputs))
        tensors = [*inputs, *self._constants] if self._constants else inputs
        if self._order is None:
            result = self.program(*inputs)
            for out, value in zip(outputs, result if isinstance(result, tuple) else (result,)):
                out.copy_(value)
            return
        try:
            _run(self._executor, tensors, [outputs[i] for i in self._order])
        except (ValueError, TypeError):
            self._refuse(inputs, outputs)

    def _refuse(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> NoReturn:
        """Raise the error that names what about these tensors does not fit the plan; when tb-core's
        reference checks find nothing, the executor's own error (being handled) is raised again."""
        check_tensors("input", inputs, self.input_metas)
        check_tensors("output", outputs, self.output_metas)
        check_no_overlap(list(inputs), list(outputs))
        raise


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
