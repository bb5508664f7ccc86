"""The native_cpu LLM backend against tb-core's LLM backend conformance suite (no tb-llm needed)."""

from __future__ import annotations

from tb_cpu_rust import _native
from tb_cpu_rust.llm import NativeLLMBackend
from torchburn.testing import LLMBackendConformance
from torchburn.testing.llm_conformance import Tolerances


class TestNativeLLMBackend(LLMBackendConformance):
    backend_type = NativeLLMBackend
    engine = "native_cpu"
    # int8 / int4 weights meet int8 activations (one scale per 32 values, as llama.cpp's Q8_0):
    # each activation moves by at most half a step, amax(block) / 254
    # From 16 rows on, where the CPU has AMX tiles (`llm_prefill_tiles()`), bf16 / int8 / int4
    # weights meet activations rounded to bf16 (int4 weights rounded too): 2^-9 per factor; so do
    # bf16 weights on the pair kernel (`llm_prefill_bf16_pairs()`: AVX-512 BF16 without AMX).
    # Elsewhere the bound stays the exact-f32 one.
    tolerances = Tolerances(
        quantized_activation_step=1 / 254 * 1.001,
        bf16_rounding=2 * 2**-9 * 1.001 if _native.llm_prefill_tiles() or _native.llm_prefill_bf16_pairs() else 0.0,
    )
