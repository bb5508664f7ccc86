"""The kernel protocol between tb-llm and an engine's LLM backend (version :data:`PROTOCOL_VERSION`).

An engine offers a backend through the ``tb_register_llm_backends`` hook, returning
``torchburn.llm.LLMBackend(name, engine, device, load, protocol_version=2)``; ``load()`` returns
an object with a ``name`` and the ``protocol_version`` it implements (:class:`KernelBackend`) and
any subset of the methods below. tb-llm checks both versions at load (a mismatch is a
:class:`~torchburn.llm.errors.BackendError` naming the engine and the versions) and composes the
backend with its PyTorch reference: the backend implements what it accelerates and declines the
rest, and the reference runs what was declined. tb-llm owns the model logic (which kernel runs
when, the KV cache, sampling); the backend owns the arithmetic.

How a backend declines:

* it does not define the method: the reference runs every call of it;
* a kernel returns ``NotImplemented`` (``embedding``, ``rms_norm``, ``rope``, ``attention``,
  ``gated_act``; ``prepare_linear`` for a weight): the reference runs that call (prepares that
  weight, and then runs ``linear`` for it: ``linear`` only ever sees the backend's own handles);
* an optional hook returns ``None`` or ``NotImplemented`` (``quantize_linear``,
  ``embedding_table``, ``compile_model``, and a compiled step for one call).

Tensor conventions (contiguous unless said otherwise), with the reference math in
:mod:`torchburn.llm.reference`:

* activations ``x``: ``[M, K]`` rows of the compute dtype (``compute_dtype(quant)``);
* ``head_quant(quant) -> str``: how to store the embedding / output head of a model quantized as
  ``quant`` (absent: int8 for int4 models, else ``quant``);
* ``prepare_linear(w: QuantWeight) -> handle``: once per weight at load time; the handle is
  opaque to tb-llm (repack, move to a device, ...). Layouts: :mod:`torchburn.llm.weights`;
* ``linear(x, handle, bias) -> [M, N]``: ``x @ W.T + bias`` with ``W`` dequantized as documented;
* ``embedding(ids, table) -> [*ids.shape, K]``: rows of the table (a ``QuantWeight``, or what
  ``embedding_table`` returned);
* ``rms_norm(x, weight, eps, offset) -> x / rms(x) * (offset + weight)``, the reduction in fp32;
* ``rope(x, cos, sin) -> x``: ``x`` is ``[B, H, T, D]`` (any strides), ``cos``/``sin``
  ``[B, 1, T, R]`` with ``R <= D`` even; the first ``R`` dims rotate in "rotate half" order, the
  rest pass through;
* ``attention(q, k, v, mask, scale, softcap) -> [B, H, T, D]``: ``q`` is ``[B, H, T, D]``,
  ``k``/``v`` are ``[B, KV, S, D]`` views of the KV cache (``H % KV == 0``, grouped-query: query
  head ``h`` reads KV head ``h // (H / KV)``), ``mask`` bool ``[B, 1, T, S]`` (True = may
  attend, at least one True per row); scores ``q.k * scale``, then ``softcap * tanh(s /
  softcap)`` when ``softcap`` is set, softmax in fp32;
* ``gated_act(gate, up, act: Activation) -> act(gate) * up``.

Optional, for faster loading and one copy of the embedding:

* ``quantize_linear(weight, quant, group_size) -> handle | None``: the checkpoint tensor ``[N, K]``
  quantized and prepared in one step; the same handle ``prepare_linear(quantize(weight, quant,
  group_size))`` gives (same numbers, :func:`torchburn.llm.quantize`).
* ``embedding_table(handle) -> table | None``: given the prepared embedding weight (the tied
  head), an :class:`~torchburn.llm.weights.EmbeddingTable` over it, so the model keeps no
  separate copy for the lookup.

Optional, for backends that run a whole step natively (no Python per layer):

* ``compile_model(model: ModelDescription) -> step | None``: once, after every weight is
  prepared. A step is ``step(ids [B, T], positions [B, T], cache, last_only) -> float32 logits``
  (``[B, V]`` for the last position, else ``[B, T, V]``; a padding position's are unspecified)
  with the numbers of
  :func:`torchburn.llm.model_forward.forward`. It follows the cache protocol of
  :mod:`torchburn.llm.kv_cache` (``begin`` first, this step's keys and values through ``write``
  or into ``keys(i)`` / ``values(i)`` at the claimed slots, ``commit(T)`` last). It may return
  ``NotImplemented`` for a call, before touching the cache (a cache type it does not handle):
  tb-llm then runs the per-kernel path for that call.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from torchburn.llm.activation import Activation
from torchburn.llm.weights import EmbeddingTable, QuantWeight

#: Version of this protocol. 1: tb-llm 0.1's (backends subclassed tb-llm's reference and
#: ``compile_model`` received tb-llm's Decoder); 2: this module.
PROTOCOL_VERSION = 2

#: Kernels a backend may define, each declinable per call with ``NotImplemented``.
KERNELS = ("embedding", "rms_norm", "rope", "attention", "gated_act")
#: Everything else a backend may define (see the module docstring for how each declines).
HOOKS = (
    "compute_dtype",
    "head_quant",
    "prepare_linear",
    "linear",
    "quantize_linear",
    "embedding_table",
    "compile_model",
)


@runtime_checkable
class KernelBackend(Protocol):
    """What every engine LLM backend has; its kernels are the optional methods above."""

    name: str
    protocol_version: int


class LLMKernels(Protocol):
    """The whole kernel surface, as tb-llm's reference and composed backends offer it."""

    name: str
    device: torch.device

    def compute_dtype(self, quant: str) -> torch.dtype: ...

    def head_quant(self, quant: str) -> str: ...

    def prepare_linear(self, w: QuantWeight) -> Any: ...

    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor: ...

    def embedding(self, ids: torch.Tensor, table: EmbeddingTable) -> torch.Tensor: ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor: ...

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor: ...

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
    ) -> torch.Tensor: ...

    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: Activation) -> torch.Tensor: ...


def declined(result: object) -> bool:
    """Whether an optional hook's or a compiled step's result means "not me, use the reference"."""
    return result is None or result is NotImplemented


def default_head_quant(quant: str) -> str:
    """The head storage of a backend without ``head_quant``: as llama.cpp's default, int4 models
    keep the embedding / output head at int8."""
    return "int8" if quant == "int4" else quant
