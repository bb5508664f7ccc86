"""The example engine's LLM backend against tb-core's LLM backend conformance suite."""

from __future__ import annotations

import torch

from tb_example_engine.llm import ExampleLLMBackend
from torchburn.llm import QuantWeight, quantize
from torchburn.testing import LLMBackendConformance


class TestExampleLLMBackend(LLMBackendConformance):
    backend_type = ExampleLLMBackend
    engine = "example"
    weight_kinds = ("fp32", "bf16")  # int8 / int4 weights are declined: tb-llm's reference keeps them


def test_declines_quantized_weights_and_other_activation_dtypes() -> None:
    be = ExampleLLMBackend()
    for kind in ("int8", "int4"):
        w: QuantWeight = quantize(torch.randn(8, 64), kind, 32)
        assert be.prepare_linear(w) is NotImplemented
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    assert be.rms_norm(x, torch.ones(16), 1e-6, 0.0) is NotImplemented
    assert not hasattr(be, "attention")  # not defined: the reference runs it
