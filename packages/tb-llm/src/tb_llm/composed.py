"""An engine's LLM backend composed with tb-llm's reference: the engine runs what it accelerates.

The rules are ``torchburn.llm.protocol``'s: a method the engine backend does not define, a kernel
call it answers with ``NotImplemented``, a weight its ``prepare_linear`` declines, run on the
:class:`~tb_llm.reference_backend.ReferenceBackend`; ``linear`` goes to whoever prepared the
handle (the reference's handles are wrapped in ``torchburn.llm.DeclinedWeight``, so an engine's
``compile_model`` sees at once that a weight is not its own). Attributes tb-llm does not know (an engine's counters) are the engine backend's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tb_llm.reference_backend import ReferenceBackend
from torchburn.llm.model import DeclinedWeight, ModelDescription
from torchburn.llm.protocol import KERNELS, PROTOCOL_VERSION, declined, default_head_quant
from torchburn.llm.weights import EmbeddingTable, QuantWeight


class ComposedBackend:
    def __init__(self, engine: Any, reference: ReferenceBackend) -> None:
        self.engine = engine
        self.reference = reference
        self.name: str = str(engine.name)
        self.device: torch.device = reference.device
        self.protocol_version = PROTOCOL_VERSION
        for kernel in KERNELS:
            fallback = self._embedding if kernel == "embedding" else getattr(reference, kernel)
            own = getattr(engine, kernel, None)
            # bound once here, not looked up per call: the per-kernel path makes thousands of calls
            setattr(self, kernel, fallback if own is None else _first_of(own, fallback))

    def __getattr__(self, name: str) -> Any:
        # only reached for names this object lacks: the engine backend's own attributes
        if name in ("engine", "reference"):
            raise AttributeError(name)
        return getattr(self.engine, name)

    def __repr__(self) -> str:
        return f"ComposedBackend({self.name!r}, reference on {self.device})"

    def compute_dtype(self, quant: str) -> torch.dtype:
        own = getattr(self.engine, "compute_dtype", None)
        return own(quant) if own is not None else self.reference.compute_dtype(quant)

    def head_quant(self, quant: str) -> str:
        own = getattr(self.engine, "head_quant", None)
        if own is not None:
            return str(own(quant))
        # the reference's choice suits its own GEMMs; an engine that prepares weights gets the default
        if getattr(self.engine, "prepare_linear", None) is None:
            return self.reference.head_quant(quant)
        return default_head_quant(quant)

    def _embedding(self, ids: torch.Tensor, table: EmbeddingTable) -> torch.Tensor:
        # the reference's lookup, at this backend's compute dtype (not the reference's)
        return table.rows(ids, self.compute_dtype(table.kind))

    # -- weights ------------------------------------------------------------------------
    def prepare_linear(self, w: QuantWeight) -> Any:
        own = getattr(self.engine, "prepare_linear", None)
        handle = own(w) if own is not None else NotImplemented
        return DeclinedWeight(self.reference.prepare_linear(w)) if handle is NotImplemented else handle

    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        if type(handle) is DeclinedWeight:
            return self.reference.linear(x, handle.handle, bias)
        return self.engine.linear(x, handle, bias)  # type: ignore[no-any-return]

    def quantize_linear(self, weight: torch.Tensor, quant: str, group_size: int) -> Any:
        own = getattr(self.engine, "quantize_linear", None)
        handle = own(weight, quant, group_size) if own is not None else None
        return None if declined(handle) else handle

    def embedding_table(self, handle: Any) -> Any:
        own = getattr(self.engine, "embedding_table", None)
        if own is None or type(handle) is DeclinedWeight:
            return None
        table = own(handle)
        return None if declined(table) else table

    def compile_model(self, model: ModelDescription) -> Callable[..., Any] | None:
        own = getattr(self.engine, "compile_model", None)
        step = own(model) if own is not None else None
        return None if declined(step) else step


def _first_of(own: Callable[..., Any], fallback: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any) -> Any:
        out = own(*args)
        return fallback(*args) if out is NotImplemented else out

    kernel.__name__ = getattr(own, "__name__", "kernel")
    return kernel
