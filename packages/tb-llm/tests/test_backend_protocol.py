"""How tb-llm loads engine backends through tb-core's contract: the protocol version check, and the
composition of a backend that implements only part of the protocol with the PyTorch reference."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F

import torchburn
from tb_llm import LLM, BackendError
from tb_llm.backends import ComposedBackend, KernelBackend
from tb_llm.model import Decoder
from torchburn.llm import DeclinedWeight, LLMBackend, ModelDescription, ProtocolVersionError, QuantWeight, reference


class PartialBackend:
    """Prepares fp32 weights only, runs linear and rms_norm (declining 4-d inputs: q/k norms)."""

    name = "partial"
    protocol_version = 2
    calls: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        type(self).calls = {"prepare": 0, "linear": 0, "rms_norm": 0, "rms_norm_declined": 0, "compile_model": 0}

    def compute_dtype(self, quant: str) -> torch.dtype:
        return torch.float32

    def prepare_linear(self, w: QuantWeight) -> Any:
        self.calls["prepare"] += 1
        return ("partial", w.weight) if w.kind == "fp32" else NotImplemented

    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        assert handle[0] == "partial", "linear only ever sees this backend's own handles"
        self.calls["linear"] += 1
        return F.linear(x, handle[1], bias)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
        if x.dim() == 4:
            self.calls["rms_norm_declined"] += 1
            return NotImplemented
        self.calls["rms_norm"] += 1
        return reference.rms_norm(x, weight, eps, offset)


class DecliningCompiler(PartialBackend):
    name = "declining-compiler"
    seen: ClassVar[list[Any]] = []

    def compile_model(self, model: ModelDescription) -> Any:
        type(self).seen = [model]

        def step(ids: torch.Tensor, positions: torch.Tensor, cache: Any, last_only: bool = True) -> Any:
            self.calls["compile_model"] += 1
            return NotImplemented  # every call: tb-llm's per-kernel path runs it

        return step


def _plugin(descriptors: list[LLMBackend]) -> Any:
    class Plugin:
        PLUGIN_API_VERSION = torchburn.PLUGIN_API_VERSION

        @staticmethod
        @torchburn.hookimpl
        def tb_register_llm_backends() -> list[Any]:
            return descriptors

    return Plugin


@pytest.fixture
def register() -> Iterator[Callable[..., None]]:
    names: list[str] = []

    def add(*descriptors: LLMBackend) -> None:
        name = f"protocol-test-{len(names)}"
        torchburn.register_plugin(_plugin(list(descriptors)), name=name)
        names.append(name)

    yield add
    for name in names:
        torchburn.unregister_plugin(name)


# -- the version check ---------------------------------------------------------------------------
def test_a_descriptor_of_another_protocol_version_is_refused_by_name(llama_dir: Path, register: Any) -> None:
    register(LLMBackend("old", "old_engine", "cpu", PartialBackend))  # protocol_version left at 1
    with pytest.raises(ProtocolVersionError) as info:
        LLM.from_pretrained(llama_dir, device="cpu", engine="old_engine")
    message = str(info.value)
    assert "'old_engine'" in message and "version 1" in message and "version 2" in message
    assert isinstance(info.value, BackendError)


def test_a_backend_object_of_another_version_is_refused(llama_dir: Path, register: Any) -> None:
    class Future(PartialBackend):
        protocol_version = 3

    register(LLMBackend("future", "future_engine", "cpu", Future, protocol_version=2))
    with pytest.raises(
        ProtocolVersionError, match=r"'future_engine' implements LLM kernel protocol version 3 \(the loaded"
    ):
        LLM.from_pretrained(llama_dir, device="cpu", engine="future_engine")


def test_auto_selection_skips_a_mismatched_backend_with_a_warning(llama_dir: Path, register: Any) -> None:
    register(
        LLMBackend("old", "old_engine", "cpu", PartialBackend, priority=1000),
        LLMBackend("partial", "partial_engine", "cpu", PartialBackend, priority=999, protocol_version=2),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = LLM.from_pretrained(llama_dir, device="cpu")
    assert llm.engine == "partial"
    assert any("'old_engine' implements LLM kernel protocol version 1" in str(w.message) for w in caught)


def test_an_object_without_a_protocol_version_is_a_version_1_backend(llama_dir: Path, register: Any) -> None:
    class Legacy:  # as backends written against tb-llm 0.1 were: no protocol_version attribute
        name = "legacy"

    register(LLMBackend("legacy", "legacy_engine", "cpu", Legacy, protocol_version=2))
    with pytest.raises(ProtocolVersionError, match=r"version 1 \(the loaded backend says so\)"):
        LLM.from_pretrained(llama_dir, device="cpu", engine="legacy_engine")


# -- composition ---------------------------------------------------------------------------------
def test_a_partial_backend_is_composed_with_the_reference(make_ckpt: Callable[..., Path], register: Any) -> None:
    folder = make_ckpt("qwen3")  # q/k norms: 4-d RMSNorm inputs, which PartialBackend declines
    register(LLMBackend("partial", "partial_engine", "cpu", PartialBackend, protocol_version=2))
    llm = LLM.from_pretrained(folder, device="cpu", engine="partial_engine")
    ref = LLM.from_pretrained(folder, device="cpu", engine="reference")
    assert isinstance(llm.backend, ComposedBackend) and isinstance(llm.backend.engine, PartialBackend)
    assert isinstance(llm.backend, KernelBackend) and llm.engine == "partial"
    prompt = llm.encode("Hello world! How are you")
    got = llm.generate(prompt, max_new_tokens=10, ignore_eos=True).token_ids
    assert got == ref.generate(prompt, max_new_tokens=10, ignore_eos=True).token_ids
    calls = PartialBackend.calls
    assert calls["linear"] > 0 and calls["rms_norm"] > 0 and calls["rms_norm_declined"] > 0
    assert llm.backend.calls is calls  # attributes tb-llm does not know are the engine backend's
    # hooks the engine lacks are absent from the composed backend too: without embedding_table
    # the embedding is not prepared as a linear weight nobody would read
    assert not hasattr(llm.backend, "embedding_table") and not hasattr(llm.backend, "compile_model")
    assert calls["prepare"] == Decoder.linear_count(llm.config)


def test_declined_weights_run_on_the_reference(llama_dir: Path, register: Any) -> None:
    register(LLMBackend("partial", "partial_engine", "cpu", PartialBackend, protocol_version=2))
    llm = LLM.from_pretrained(llama_dir, quant="int8", device="cpu", engine="partial_engine")
    ref = LLM.from_pretrained(llama_dir, quant="int8", device="cpu", engine="reference")
    handle = llm.model.layers[0].o.handle
    assert isinstance(handle, DeclinedWeight)  # int8: PartialBackend prepares fp32 only
    prompt = llm.encode("The quick brown fox")
    # the head: int8 (the default for a backend that prepares weights) vs the reference's bf16
    ids, pos = torch.tensor([prompt]), torch.arange(len(prompt))[None]
    got = llm.model.forward(ids, pos, llm.model.new_cache(1, 16), last_only=False)
    want = ref.model.forward(ids, pos, ref.model.new_cache(1, 16), last_only=False)
    assert float(F.cosine_similarity(got[0], want[0], dim=-1).min()) > 0.999
    assert PartialBackend.calls["linear"] == 0  # nothing of int8 reached the backend's linear


def test_compile_model_gets_the_description_and_a_declined_step_runs_per_kernel(llama_dir: Path, register: Any) -> None:
    register(LLMBackend("dc", "dc_engine", "cpu", DecliningCompiler, protocol_version=2))
    llm = LLM.from_pretrained(llama_dir, device="cpu", engine="dc_engine")
    (model,) = DecliningCompiler.seen
    assert isinstance(model, ModelDescription) and model is llm.model.description
    assert model.num_layers == llm.config.num_layers and model.vocab_size == llm.config.vocab_size
    ref = LLM.from_pretrained(llama_dir, device="cpu", engine="reference")
    got = llm.generate("Hello", max_new_tokens=4, ignore_eos=True).token_ids
    assert got == ref.generate("Hello", max_new_tokens=4, ignore_eos=True).token_ids
    assert DecliningCompiler.calls["compile_model"] == 4 and DecliningCompiler.calls["linear"] > 0


def test_an_object_that_is_no_backend_is_refused(llama_dir: Path, register: Any) -> None:
    class Nameless:
        protocol_version = 2

    register(LLMBackend("nameless", "nameless_engine", "cpu", Nameless, protocol_version=2))
    with pytest.raises(BackendError, match=r"not a torchburn\.llm\.KernelBackend"):
        LLM.from_pretrained(llama_dir, device="cpu", engine="nameless_engine")
