"""The native_cpu LLM backend against tb-core's LLM backend conformance suite (no tb-llm needed)."""

from __future__ import annotations

from tb_cpu_rust.llm import NativeLLMBackend
from torchburn.testing import LLMBackendConformance
from torchburn.testing.llm_conformance import Tolerances


class TestNativeLLMBackend(LLMBackendConformance):
    backend_type = NativeLLMBackend
    engine = "native_cpu"
    # int8 / int4 weights meet int8 activations (one scale per 32 values, as llama.cpp's Q8_0):
    # each activation moves by at most half a step, amax(block) / 254
    tolerances = Tolerances(quantized_activation_step=1 / 254 * 1.001)
