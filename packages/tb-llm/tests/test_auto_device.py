"""``device="auto"``: the measured choice among backends, its cache and what ``info()`` says.

The fake backends are slow by construction (a sleep in every matmul), so no assertion here rests
on how fast real kernels happen to run on the machine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F

from tb_llm import LLM, auto_device
from tb_llm.errors import BackendError
from tb_llm.reference_backend import ReferenceBackend
from torchburn.llm import LLMBackend, QuantWeight

PROMPT = [1, 5, 9, 14, 3]


class SlowBackend:
    """Runs every fp32 matmul itself, after an 8 ms pause: slower than any real backend, even on a
    loaded machine (a probe step of the tiny model makes 15 matmuls: over 120 ms)."""

    name = "slow"
    protocol_version = 2
    loads: ClassVar[int] = 0

    def __init__(self) -> None:
        SlowBackend.loads += 1

    def compute_dtype(self, quant: str) -> torch.dtype:
        return torch.float32

    def prepare_linear(self, w: QuantWeight) -> Any:
        return w.weight if w.kind == "fp32" else NotImplemented

    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        time.sleep(0.008)
        return F.linear(x, handle, bias)


class FastBackend(SlowBackend):
    """Declines every weight: the reference's kernels run the model, no pause."""

    name = "fast"

    def prepare_linear(self, w: QuantWeight) -> Any:
        return NotImplemented


def _no_adapter() -> Any:
    raise RuntimeError("no WebGPU adapter on this machine")


SLOW = LLMBackend("slow", "slow_engine", "cpu", SlowBackend, priority=100, protocol_version=2)
FAST = LLMBackend("fast", "fast_engine", "cpu", FastBackend, priority=50, protocol_version=2)
NO_GPU = LLMBackend("gpu_fake", "gpu_engine", "gpu", _no_adapter, priority=200, protocol_version=2)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Only the fake engines (and the reference) are candidates; a fresh cache folder."""
    monkeypatch.setattr(auto_device, "_descriptors", lambda: [NO_GPU, SLOW, FAST])
    monkeypatch.setattr("tb_llm.backends._gpu_device", lambda: None)
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path / "cache"))
    SlowBackend.loads = 0
    return tmp_path / "cache"


def test_auto_measures_and_leaves_a_slow_default(llama_dir: Path, fakes: Path) -> None:
    llm = LLM.from_pretrained(llama_dir)
    choice = llm.info()["device_choice"]
    assert choice["how"] == "measured" and choice["default"] == "slow", choice  # the highest-priority CPU backend
    assert choice["chosen"] == llm.engine and llm.engine in ("fast", "reference"), choice
    figures = choice["candidates"]
    assert set(figures) == {"gpu_fake", "slow", "fast", "reference"}
    assert "no WebGPU adapter" in figures["gpu_fake"]["error"]  # a backend that cannot run is reported
    # the slow backend pauses 8 ms per matmul: its estimate is far above the chosen one's
    assert figures["slow"]["ms_per_token"] > 3 * figures[llm.engine]["ms_per_token"], figures
    assert all(f["steps"] >= auto_device.MIN_STEPS for n, f in figures.items() if n != "gpu_fake")
    assert choice["probe"]["layers"] >= 1 and choice["probe"]["scale"] >= 1.0
    assert "slow" in choice["why"]
    # the measured choice generates what the reference does
    ref = LLM.from_pretrained(llama_dir, engine="reference")
    want = ref.generate(PROMPT, max_new_tokens=8, ignore_eos=True).token_ids
    assert llm.generate(PROMPT, max_new_tokens=8, ignore_eos=True).token_ids == want


def test_the_choice_is_cached_and_only_the_chosen_backend_loads(llama_dir: Path, fakes: Path) -> None:
    first = LLM.from_pretrained(llama_dir).info()["device_choice"]
    assert SlowBackend.loads == 2, first  # slow, and fast (a subclass) were loaded to be probed
    path = Path(first["cache_file"])
    assert path.parent == fakes / "llm-device" and path.is_file()
    stored = json.loads(path.read_text())
    assert stored["key"]["quant"] == "fp32" and stored["choice"]["chosen"] == first["chosen"]
    again = LLM.from_pretrained(llama_dir)
    second = again.info()["device_choice"]
    assert second["how"] == "cached" and second["chosen"] == first["chosen"] == again.engine, (first, second)
    assert second["candidates"] == first["candidates"]  # the figures measured before
    # nothing probed; only the chosen one loaded
    assert SlowBackend.loads == 2 + (again.engine == "fast"), (first, second)


def test_a_changed_backend_version_or_quant_is_measured_again(
    llama_dir: Path, fakes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = LLM.from_pretrained(llama_dir).info()["device_choice"]
    assert LLM.from_pretrained(llama_dir).info()["device_choice"]["how"] == "cached"
    bf16 = LLM.from_pretrained(llama_dir, quant="bf16").info()["device_choice"]
    assert bf16["how"] == "measured" and bf16["cache_file"] != first["cache_file"]
    real_version = auto_device._version
    monkeypatch.setattr(auto_device, "_version", lambda module: real_version(module) + "-rebuilt")
    rebuilt = LLM.from_pretrained(llama_dir).info()["device_choice"]
    assert rebuilt["how"] == "measured" and rebuilt["cache_file"] != first["cache_file"]


def test_more_threads_is_another_machine(llama_dir: Path, fakes: Path) -> None:
    threads = torch.get_num_threads()
    LLM.from_pretrained(llama_dir)
    try:
        torch.set_num_threads(threads + 1)
        assert LLM.from_pretrained(llama_dir).info()["device_choice"]["how"] == "measured"
    finally:
        torch.set_num_threads(threads)


def test_a_corrupt_or_foreign_cache_file_is_measured_again(llama_dir: Path, fakes: Path) -> None:
    path = Path(LLM.from_pretrained(llama_dir).info()["device_choice"]["cache_file"])
    path.write_text("{ not json")
    assert LLM.from_pretrained(llama_dir).info()["device_choice"]["how"] == "measured"
    stored = json.loads(path.read_text())
    stored["key"]["shape"]["hidden"] += 1  # a file whose key is not this load's (a hash collision)
    path.write_text(json.dumps(stored))
    assert LLM.from_pretrained(llama_dir).info()["device_choice"]["how"] == "measured"


def test_a_cached_choice_that_no_longer_loads_is_measured_again(
    llama_dir: Path, fakes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Path(LLM.from_pretrained(llama_dir).info()["device_choice"]["cache_file"])
    stored = json.loads(path.read_text())
    stored["choice"]["chosen"] = "gpu_fake"  # measured on a day the adapter was there
    path.write_text(json.dumps(stored))
    llm = LLM.from_pretrained(llama_dir)
    assert llm.info()["device_choice"]["how"] == "measured" and llm.engine != "gpu_fake"


def test_cache_off_measures_every_load(llama_dir: Path, fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "0")
    for _ in range(2):
        choice = LLM.from_pretrained(llama_dir).info()["device_choice"]
        assert choice["how"] == "measured" and choice["cache_file"] is None
    assert not fakes.exists()


def test_only_the_reference_is_no_probe(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto_device, "_descriptors", lambda: [])
    monkeypatch.setattr("tb_llm.backends._gpu_device", lambda: None)
    llm = LLM.from_pretrained(llama_dir)
    assert llm.engine == "reference"
    assert llm.info()["device_choice"] == {"chosen": "reference", "how": "only candidate", "candidates": {}}


def test_an_engine_or_a_device_skips_the_measurement(llama_dir: Path, fakes: Path) -> None:
    assert "device_choice" not in LLM.from_pretrained(llama_dir, device="cpu").info()
    llm = LLM.from_pretrained(llama_dir, engine="reference")
    assert llm.engine == "reference" and "device_choice" not in llm.info()
    assert SlowBackend.loads == 0


def test_decide_keeps_the_default_unless_another_is_clearly_faster() -> None:
    decide = auto_device.decide
    close = {"a": {"ms_per_token": 10.0}, "b": {"ms_per_token": 9.0}}
    assert decide(close, "a")[0] == "a" and "the default stays" in decide(close, "a")[1]
    far = {"a": {"ms_per_token": 10.0}, "b": {"ms_per_token": 5.0}}
    assert decide(far, "a")[0] == "b"
    assert decide({"a": {"error": "x"}, "b": {"ms_per_token": 5.0}}, "a") == (
        "b",
        "b measured fastest, 5 ms/token (the default a could not run)",
    )
    with pytest.raises(BackendError, match=r"no backend could run the probe: a: boom"):
        decide({"a": {"error": "boom"}}, "a")


def test_probe_model_shape() -> None:
    from tb_llm.config import parse_config

    raw = {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    }
    cfg = parse_config(raw)
    small = auto_device.probe_config(cfg)
    # every size of a layer is the model's; fewer layers, a capped vocabulary
    assert (small.hidden_size, small.intermediate_size, small.num_heads, small.num_kv_heads) == (896, 4864, 14, 2)
    assert 1 <= small.num_layers <= auto_device.PROBE_MAX_LAYERS and small.vocab_size == auto_device.PROBE_VOCAB
    per_layer = 896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864
    assert auto_device.linear_params(cfg) == 24 * per_layer + 151936 * 896
    big = parse_config({**raw, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64})
    assert auto_device.probe_config(big).num_layers == 1  # one layer of a 70B-shaped model is already plenty


def test_probe_on_the_reference_kernels(llama_dir: Path) -> None:
    llm = LLM.from_pretrained(llama_dir, device="cpu", engine="reference")
    figures = auto_device.probe(ReferenceBackend("cpu"), llm.config, "int8", 32)
    assert figures["ms_per_token"] > 0 and figures["steps"] >= auto_device.MIN_STEPS
    assert figures["probe_ms_per_step"] > 0


def test_a_real_auto_load(llama_dir: Path) -> None:
    """Whatever this machine has installed: the choice is one of the candidates, explained, and
    its greedy tokens are the reference's."""
    llm = LLM.from_pretrained(llama_dir)
    choice = llm.info()["device_choice"]
    assert choice["chosen"] == llm.engine
    assert choice["how"] in ("measured", "cached", "only candidate")
    if choice["how"] != "only candidate":
        assert "reference" in choice["candidates"]
        assert any("ms_per_token" in f for f in choice["candidates"].values())
    ref = LLM.from_pretrained(llama_dir, engine="reference")
    want = ref.generate(PROMPT, max_new_tokens=8, ignore_eos=True).token_ids
    assert llm.generate(PROMPT, max_new_tokens=8, ignore_eos=True).token_ids == want
