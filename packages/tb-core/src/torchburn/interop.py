"""How one engine uses another's compiled programs and eager kernels, through tb-core only.

An engine package never imports another engine package (their versions move independently).
Instead an engine that can offer its work to others overrides two optional ``Engine`` methods:

* ``Engine.prepare(plan) -> PreparedProgram | None``: the plan compiled the way the engine's own
  ``compile`` does it, as a program that writes into output tensors the caller allocated
  (``run_into``) or allocates them itself (``run``);
* ``Engine.eager_kernel(op, dtype) -> Callable | None``: one op as a plain function of tensors
  (``fn(x) -> new tensor``), for a caller that dispatches single eager calls.

Both default to ``None`` ("not offered"), so engines built before these existed keep working
under the same ``PLUGIN_API_VERSION``. A caller finds an engine that offers them with
``engines_with("prepare")`` / ``engines_with("eager_kernel")`` (installed and available engines,
highest priority first) or asks one by name with ``find_engine``.

What crosses is tb-core data (``Plan``, ``TensorMeta``) and torch tensors; nothing of either
engine's internals.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from torchburn.plan import Plan, Ref, TensorMeta

if TYPE_CHECKING:
    from torchburn.engine import Engine

#: A single-op eager kernel: takes the op's tensor arguments positionally, returns a new tensor.
EagerKernel = Callable[..., torch.Tensor]

Capability = Literal["prepare", "eager_kernel"]


class PreparedProgram(abc.ABC):
    """A plan compiled by an engine, runnable into the caller's own output tensors.

    ``inputs`` are the plan's non-constant inputs in slot order (constants are the program's);
    ``outputs`` one tensor per plan output. Every tensor must have exactly the dtype, device,
    sizes and strides of ``input_metas`` / ``output_metas`` (strides of size-1 dims are free), no
    lazy negation or conjugation bit, and no output may overlap another output or an input.
    Anything else raises ``ValueError`` (``TypeError`` for a non-tensor) naming the tensor; a
    program never reads or writes memory it was not given. The program records no autograd
    graph: callers that need one run their own path.
    """

    def __init__(self, plan: Plan) -> None:
        reason = preparable(plan)
        if reason is not None:
            raise ValueError(f"cannot prepare this plan: {reason}")
        self.plan = plan
        n_user = len(plan.inputs) - len(plan.constants)
        self.input_metas: tuple[TensorMeta, ...] = tuple(m for m in plan.inputs[:n_user] if m is not None)
        self.output_metas: tuple[TensorMeta, ...] = tuple(plan.slot_meta(o.slot) for o in plan.outputs)

    @abc.abstractmethod
    def run_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Run once, writing the plan's outputs into ``outputs``."""

    def run(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Run once into fresh tensors laid out as ``output_metas``."""
        outputs = tuple(empty_like_meta(m) for m in self.output_metas)
        self.run_into(inputs, outputs)
        return outputs


def preparable(plan: Plan) -> str | None:
    """None when ``plan`` has the form a ``PreparedProgram`` needs, else why not.

    Every input and output must be a tensor with static sizes and strides, and every output a
    value of the plan (a ``Ref``), so the caller can allocate it from its ``TensorMeta``.
    """
    for slot, meta in enumerate(plan.inputs):
        if meta is None:
            return f"input {slot} is not a tensor"
        if meta.symbolic:
            return f"input {slot} has a symbolic shape"
    for index, out in enumerate(plan.outputs):
        if not isinstance(out, Ref):
            return f"output {index} is a literal, not a tensor of the plan"
        meta = plan.slot_meta(out.slot)
        if not isinstance(meta, TensorMeta):
            return f"output {index} is not a tensor"
        if meta.symbolic:
            return f"output {index} has a symbolic shape"
    return None


def empty_like_meta(meta: TensorMeta) -> torch.Tensor:
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=meta.device)


def check_tensors(what: str, tensors: Sequence[Any], metas: Sequence[TensorMeta]) -> None:
    """Raise ``ValueError`` / ``TypeError`` unless each tensor matches its meta (see PreparedProgram).

    The reference check, for engines whose fast path only compares what it must and calls this
    to name the problem once that comparison failed.
    """
    if len(tensors) != len(metas):
        raise ValueError(f"expected {len(metas)} {what} tensors, got {len(tensors)}")
    for index, (t, meta) in enumerate(zip(tensors, metas)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} {index} is a {type(t).__name__}, not a tensor")
        if t.layout is not torch.strided:
            raise ValueError(f"{what} {index} has layout {t.layout}, expected torch.strided")
        if t.dtype is not meta.dtype:
            raise ValueError(f"{what} {index} has dtype {t.dtype}, expected {meta.dtype}")
        if t.device.type != meta.device:
            raise ValueError(f"{what} {index} is on {t.device}, expected {meta.device}")
        if tuple(t.shape) != meta.shape:
            raise ValueError(f"{what} {index} has sizes {tuple(t.shape)}, expected {meta.shape}")
        if any(n > 1 and a != b for n, a, b in zip(meta.shape, t.stride(), meta.stride)):
            raise ValueError(f"{what} {index} has strides {t.stride()}, expected {meta.stride}")
        if t.is_neg() or t.is_conj():
            raise ValueError(
                f"{what} {index} is a lazy negated or conjugated view; pass t.resolve_neg().resolve_conj()"
            )


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses a strided tensor may touch (empty for no elements)."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return start, start + extent * t.element_size()


def check_no_overlap(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    """Raise ``ValueError`` when an output's bytes may overlap another output's or an input's
    (``TypeError`` when one of them is not a tensor)."""
    for what, tensors in (("input", inputs), ("output", outputs)):
        for index, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{what} {index} is a {type(t).__name__}, not a tensor")
            if t.layout is not torch.strided:
                raise ValueError(f"{what} {index} has layout {t.layout}, expected torch.strided")
    spans_in = [byte_span(t) for t in inputs]
    spans_out = [byte_span(t) for t in outputs]
    for i, (a0, a1) in enumerate(spans_out):
        if a0 == a1:
            continue
        for j, (b0, b1) in enumerate(spans_out[:i]):
            if b0 < a1 and a0 < b1:
                raise ValueError(f"output {i} overlaps output {j}")
        for j, (b0, b1) in enumerate(spans_in):
            if b0 < a1 and a0 < b1:
                raise ValueError(f"output {i} overlaps input {j}")


# -- finding engines ------------------------------------------------------------------------------
def installed_engines() -> dict[str, Engine]:
    """Engines loaded from plugins whose ``is_available()`` holds, by name."""
    from torchburn.plugins import engines

    out = {}
    for name, engine in engines().items():
        try:
            ok = bool(engine.is_available())
        except Exception:  # an availability probe that raises means "not available"
            ok = False
        if ok:
            out[name] = engine
    return out


def find_engine(name: str) -> Engine | None:
    """The installed, available engine called ``name``, or None."""
    return installed_engines().get(name)


def engines_with(capability: Capability, *, device: str | None = None) -> list[Engine]:
    """Available engines that override ``Engine.<capability>``, highest priority first.

    An engine offers a capability by overriding the method; it may still return None for a
    particular plan or op, so callers try the next engine.
    """
    from torchburn.engine import Engine

    if capability not in ("prepare", "eager_kernel"):
        raise ValueError(f"unknown capability {capability!r}: 'prepare' or 'eager_kernel'")
    base = getattr(Engine, capability)
    found = [
        e
        for e in installed_engines().values()
        if getattr(type(e), capability) is not base and (device is None or e.device == device)
    ]
    return sorted(found, key=lambda e: (-e.priority, e.name))


__all__ = [
    "Capability",
    "EagerKernel",
    "PreparedProgram",
    "byte_span",
    "check_no_overlap",
    "check_tensors",
    "empty_like_meta",
    "engines_with",
    "find_engine",
    "installed_engines",
    "preparable",
]
