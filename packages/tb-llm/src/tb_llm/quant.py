"""Load-time weight quantization and its storage layouts.

The layouts (``QuantWeight``) and the quantizer that fixes their numbers are the contract with
engine kernels, so they live in tb-core (:mod:`torchburn.llm.weights`,
:mod:`torchburn.llm.quantize`); this module keeps the names tb-llm has always exported.
"""

from __future__ import annotations

from torchburn.llm.quantize import quantize, quantize_int4, quantize_int8
from torchburn.llm.weights import GROUP_SIZES, QUANTS, QuantWeight, pack_int4, unpack_int4

__all__ = [
    "GROUP_SIZES",
    "QUANTS",
    "QuantWeight",
    "pack_int4",
    "quantize",
    "quantize_int4",
    "quantize_int8",
    "unpack_int4",
]
