"""A third-party LLM backend (the example engine's, plain PyTorch, declining quantized weights,
non-float32 activations and attention) serving tb-llm end to end, through tb-core's contract only.

The example engine is a template that the integration session does not install, so its plugin
module is loaded from the source tree and registered in-process, as its entry point would be.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import torchburn
from tb_llm import LLM
from tb_llm.testing import make_checkpoint
from torchburn.llm import DeclinedWeight

EXAMPLE_SRC = Path(__file__).resolve().parents[1] / "examples" / "tb-example-engine" / "src"


@pytest.fixture(scope="module", autouse=True)
def example_plugin() -> Iterator[None]:
    if "example" in torchburn.plugins.engines():  # installed: its entry point already registered it
        yield
        return
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(EXAMPLE_SRC))
    from tb_example_engine import plugin

    torchburn.register_plugin(plugin, "tb-example-engine-from-source")
    try:
        yield
    finally:
        torchburn.unregister_plugin("tb-example-engine-from-source")
        mp.undo()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("example-llm") / "model")


def test_example_backend_generates_the_reference_tokens(folder: Path) -> None:
    llm = LLM.from_pretrained(folder, quant="fp32", device="cpu", engine="example")
    ref = LLM.from_pretrained(folder, quant="fp32", device="cpu", engine="reference")
    assert llm.engine == "example" and llm.model._fused is None  # no compile_model: per-kernel path
    prompt = llm.encode("Hello world! How are you")
    got = llm.generate(prompt, max_new_tokens=16, ignore_eos=True).token_ids
    assert got == ref.generate(prompt, max_new_tokens=16, ignore_eos=True).token_ids


def test_declined_int8_weights_run_on_the_reference(folder: Path) -> None:
    llm = LLM.from_pretrained(folder, quant="int8", device="cpu", engine="example")
    ref = LLM.from_pretrained(folder, quant="int8", device="cpu", engine="reference")
    assert isinstance(llm.model.layers[0].o.handle, DeclinedWeight)
    ids = torch.tensor([llm.encode("The quick brown fox jumps")])
    pos = torch.arange(ids.shape[1])[None]
    got = llm.model.forward(ids, pos, llm.model.new_cache(1, 16), last_only=False)
    want = ref.model.forward(ids, pos, ref.model.new_cache(1, 16), last_only=False)
    # the same int8 layers; only the head differs (int8 here, bf16 in the reference's choice)
    cos = torch.nn.functional.cosine_similarity(got[0], want[0], dim=-1)
    assert float(cos.min()) > 0.999


def test_example_backend_is_never_the_default_over_native_cpu(folder: Path) -> None:
    assert LLM.from_pretrained(folder, device="cpu").engine == "native_cpu"
