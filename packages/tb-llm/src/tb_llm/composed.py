"""An engine's LLM backend composed with tb-llm's reference: the engine runs what it accelerates.

The rules are ``torchburn.llm.protocol``'s: a method the engine backend does not define, a kernel
call it answers with ``NotImplemented``, a weight its ``prepare_linear`` declines, run on the
:class:`~tb_llm.reference_backend.ReferenceBackend`; ``linear`` goes to whoever prepared the
handle (the reference's handles are wrapped in ``torchburn.llm.DeclinedWeight``, so an engine's
``compile_model`` sees at once that a weight is not its own). Attributes tb-llm does not know
(an engine's counters) are the engine backend's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tb_llm.reference_backend import ReferenceBackend
from torchburn.llm.model import DeclinedWeight
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
        self._hooks()

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

    # The optional hooks exist on this object only where the engine defines them: tb-llm asks
    # whether a backend has them (an embedding_table hook makes it prepare the embedding as a
    # linear weight, wasted work where nothing would read it). Set in __init__ by _hooks().
    def _hooks(self) -> None:
        for hook in ("quantize_linear", "compile_model"):
            own = getattr(self.engine, hook, None)
            if callable(own):
                setattr(self, hook, _none_if_declined(own))
        own_table = getattr(self.engine, "embedding_table", None)
        if callable(own_table):

            def embedding_table(handle: Any) -> Any:
                if type(handle) is DeclinedWeight:  # the reference's weight: no table over it
                    return None
                table = own_table(handle)
                return None if declined(table) else table

            self.embedding_table = embedding_table


def _none_if_declined(own: Callable[..., Any]) -> Callable[..., Any]:
    def hook(*args: Any) -> Any:
        out = own(*args)
        return None if declined(out) else out

    hook.__name__ = getattr(own, "__name__", "hook")
    return hook


def _first_of(own: Callable[..., Any], fallback: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any) -> Any:
        out = own(*args)
        return fallback(*args) if out is NotImplemented else out

    kernel.__name__ = getattr(own, "__name__", "kernel")
    return kernel
