"""LLMBackendConformance itself: a correct backend passes every case, and each kind of mistake a
backend can make fails at least one case (a suite that cannot fail proves nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchburn
from torchburn.llm import LLMBackend, ModelDescription, ReferenceKernels, forward, reference
from torchburn.testing import LLMBackendConformance
from torchburn.testing.llm_conformance import Tolerances, claims, llm_cases


class CompilingReference(ReferenceKernels):
    """tb-core's reference kernels plus a compile_model that runs the description's forward."""

    name = "compiling-reference"

    def compile_model(self, model: ModelDescription) -> Any:
        def step(ids: torch.Tensor, positions: torch.Tensor, cache: Any, last_only: bool = True) -> Any:
            return forward(model, self, ids, positions, cache, last_only)

        return step


class _Plugin:
    PLUGIN_API_VERSION = torchburn.PLUGIN_API_VERSION

    @staticmethod
    @torchburn.hookimpl
    def tb_register_llm_backends() -> list[Any]:
        return [LLMBackend("compiling-reference", "tb-core-test-llm", "cpu", CompilingReference, protocol_version=2)]


@pytest.fixture(autouse=True)
def _registered() -> Iterator[None]:  # after conftest's per-test isolation, which clears plugins
    torchburn.register_plugin(_Plugin, name="tb-core-test-llm")
    yield
    torchburn.unregister_plugin("tb-core-test-llm")


class TestCompilingReference(LLMBackendConformance):
    backend_type = CompilingReference
    engine = "tb-core-test-llm"


def test_claims_are_read_from_the_class() -> None:
    assert claims(CompilingReference) >= {"rms_norm", "attention", "prepare_linear", "linear", "compile_model"}
    assert "quantize_linear" not in claims(CompilingReference)


# -- mistakes the suite must catch ---------------------------------------------------------------
class NormWithoutEps(CompilingReference):
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
        return reference.rms_norm(x, weight, 1e-2, offset)


class NormIgnoringOffset(CompilingReference):
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
        return reference.rms_norm(x, weight, eps, 0.0)


class RopeRotatingEveryDim(CompilingReference):
    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = cos.shape[-1]
        reps = x.shape[-1] // r
        return reference.rope(x, cos.repeat(1, 1, 1, reps), sin.repeat(1, 1, 1, reps))


class AttentionWithInterleavedGroups(CompilingReference):
    """Query head h reads KV head h % KV instead of h // (H / KV)."""

    def attention(self, q: Any, k: Any, v: Any, mask: Any, scale: float, softcap: float | None) -> torch.Tensor:
        g = q.shape[1] // k.shape[1]
        return reference.attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), mask, scale, softcap)


class AttentionWithoutSoftcap(CompilingReference):
    def attention(self, q: Any, k: Any, v: Any, mask: Any, scale: float, softcap: float | None) -> torch.Tensor:
        return reference.attention(q, k, v, mask, scale, None)


class SiluForEveryActivation(CompilingReference):
    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: Any) -> torch.Tensor:
        return F.silu(gate) * up


class LinearWithoutBias(CompilingReference):
    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        return reference.linear(x, handle, None)


class Int4ZeroPointOffByOne(CompilingReference):
    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        y = reference.linear(x, handle, bias)
        if handle.kind == "int4":  # (q - 7) instead of (q - 8): one scale too much per group
            y = y + (x.double() @ handle.scales.double().repeat_interleave(handle.group_size, dim=1).T).to(y.dtype)
        return y


class DeclinesEverything(CompilingReference):
    def rms_norm(self, *args: Any) -> Any:
        return NotImplemented

    def gated_act(self, *args: Any) -> Any:
        return NotImplemented


class WritesIntoItsInput(CompilingReference):
    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: Any) -> torch.Tensor:
        return gate.mul_(0).add_(reference.gated_act(gate.clone(), up, act))


class StepWithoutFinalSoftcap(CompilingReference):
    def compile_model(self, model: ModelDescription) -> Any:
        import dataclasses

        return super().compile_model(dataclasses.replace(model, final_softcap=None))


class StepIgnoringTheSlidingWindow(CompilingReference):
    def compile_model(self, model: ModelDescription) -> Any:
        import dataclasses

        return super().compile_model(dataclasses.replace(model, sliding_window=None))


class StepThatDeclinesAfterWriting(CompilingReference):
    def compile_model(self, model: ModelDescription) -> Any:
        inner = super().compile_model(model)

        def step(ids: torch.Tensor, positions: torch.Tensor, cache: Any, last_only: bool = True) -> Any:
            if type(cache).__name__ == "_RowView":
                cache.begin(positions)
                return NotImplemented
            return inner(ids, positions, cache, last_only)

        return step


class QuantizeLinearWithOtherNumbers(CompilingReference):
    def quantize_linear(self, weight: torch.Tensor, quant: str, group_size: int) -> Any:
        from torchburn.llm import quantize

        return quantize(weight * 1.01, quant, group_size)


class WrongVersion(CompilingReference):
    protocol_version = 1


@pytest.mark.parametrize(
    ("backend_type", "prefix"),
    [
        (NormWithoutEps, "rms_norm"),
        (NormIgnoringOffset, "rms_norm"),
        (RopeRotatingEveryDim, "rope"),
        (AttentionWithInterleavedGroups, "attention"),
        (AttentionWithoutSoftcap, "attention"),
        (SiluForEveryActivation, "gated_act"),
        (LinearWithoutBias, "linear"),
        (Int4ZeroPointOffByOne, "linear-int4"),
        (DeclinesEverything, "rms_norm"),
        (DeclinesEverything, "gated_act"),
        (WritesIntoItsInput, "gated_act"),
        (StepWithoutFinalSoftcap, "compile_model-gemma2"),
        (StepIgnoringTheSlidingWindow, "compile_model-gemma2"),
        (StepThatDeclinesAfterWriting, "compile_model-llama"),
        (QuantizeLinearWithOtherNumbers, "quantize_linear"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else v,
)
def test_the_suite_catches(backend_type: type, prefix: str) -> None:
    be = backend_type()
    have = claims(backend_type)
    cases = [
        c for c in llm_cases(("fp32", "bf16", "int8", "int4"), True) if c.id.startswith(prefix) and c.needs in have
    ]
    assert cases, f"no case starts with {prefix!r}"
    failed = []
    for case in cases:
        try:
            case.run(be, Tolerances())
        except AssertionError:
            failed.append(case.id)
    assert failed, f"{backend_type.__name__} passed every {prefix} case"


def test_the_suite_catches_a_wrong_protocol_version() -> None:
    class TestWrong(LLMBackendConformance):
        backend_type = WrongVersion
        engine = "tb-core-test-llm"

    with pytest.raises(AssertionError, match="implements protocol 1"):
        TestWrong().test_protocol_version()
