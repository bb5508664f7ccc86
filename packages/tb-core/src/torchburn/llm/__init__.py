"""The contract between tb-llm and an engine's LLM backend.

* :mod:`~torchburn.llm.protocol`: the versioned kernel protocol and how a backend declines;
* :mod:`~torchburn.llm.weights` / :mod:`~torchburn.llm.quantize`: the weight formats and the
  quantizer that fixes their numbers;
* :mod:`~torchburn.llm.kv_cache`: the KV cache a step writes to;
* :mod:`~torchburn.llm.model` / :mod:`~torchburn.llm.model_forward`: the model description a
  whole-model compile receives, and its forward pass;
* :mod:`~torchburn.llm.reference`: each kernel's reference math;
* :mod:`~torchburn.llm.descriptor`: what ``tb_register_llm_backends`` returns.

An engine implements this without importing tb-llm; ``torchburn.testing.LLMBackendConformance``
checks it. ``torchburn.LLM`` (the model class, from tb-llm) is a different name from this package.
"""

from __future__ import annotations

from torchburn.llm.activation import Activation
from torchburn.llm.descriptor import LLMBackend, llm_backends
from torchburn.llm.errors import BackendError, LLMError, ProtocolVersionError
from torchburn.llm.kv_cache import CacheLike, KVCache
from torchburn.llm.model import DeclinedWeight, DecoderLayer, ModelDescription, PreparedLinear, RopeFn
from torchburn.llm.model_forward import forward
from torchburn.llm.protocol import (
    HOOKS,
    KERNELS,
    PROTOCOL_VERSION,
    KernelBackend,
    LLMKernels,
    declined,
    default_head_quant,
)
from torchburn.llm.quantize import quantize, quantize_int4, quantize_int8
from torchburn.llm.reference import ReferenceKernels
from torchburn.llm.weights import GROUP_SIZES, QUANTS, EmbeddingTable, QuantWeight, pack_int4, unpack_int4

__all__ = [
    "GROUP_SIZES",
    "HOOKS",
    "KERNELS",
    "PROTOCOL_VERSION",
    "QUANTS",
    "Activation",
    "BackendError",
    "CacheLike",
    "DeclinedWeight",
    "DecoderLayer",
    "EmbeddingTable",
    "KVCache",
    "KernelBackend",
    "LLMBackend",
    "LLMError",
    "LLMKernels",
    "ModelDescription",
    "PreparedLinear",
    "ProtocolVersionError",
    "QuantWeight",
    "ReferenceKernels",
    "RopeFn",
    "declined",
    "default_head_quant",
    "forward",
    "llm_backends",
    "pack_int4",
    "quantize",
    "quantize_int4",
    "quantize_int8",
    "unpack_int4",
]
