"""tb-llm under bad input and interruption: corrupted checkpoints fail cleanly; Ctrl-C is survivable."""

from __future__ import annotations

import _thread
import json
import pathlib
import shutil
import signal
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tb_llm = pytest.importorskip("tb_llm", reason="tb-llm is not installed")
pytest.importorskip("transformers", reason="the tiny checkpoint is built with transformers")

from tb_llm import LLM  # noqa: E402
from tb_llm.errors import LLMError  # noqa: E402
from tb_llm.testing import make_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("ckpt") / "model")


@pytest.fixture(scope="module")
def llm(checkpoint: pathlib.Path) -> LLM:
    return LLM.from_pretrained(checkpoint, device="cpu")


CORRUPTIONS = ["truncate", "flip", "header_length", "json_garbage"]
FILES = ["model.safetensors", "config.json", "tokenizer_config.json"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(FILES), how=st.sampled_from(CORRUPTIONS), where=st.floats(0, 1), byte=st.integers(0, 255))
def test_corrupted_checkpoint_fails_cleanly(
    checkpoint: pathlib.Path, tmp_path_factory: pytest.TempPathFactory, target: str, how: str, where: float, byte: int
) -> None:
    folder = tmp_path_factory.mktemp("bad") / "model"
    shutil.copytree(checkpoint, folder)
    path = folder / target
    data = bytearray(path.read_bytes())
    if how == "truncate":
        data = data[: int(len(data) * where)]
    elif how == "flip":
        # within the first 4 KiB: the safetensors header or the JSON text
        data[int(min(len(data), 4096) * where) % max(len(data), 1)] ^= byte or 1
    elif how == "header_length" and target.endswith(".safetensors"):
        data[:8] = int(where * 2**63).to_bytes(8, "little")
    else:
        data = bytearray(b"{not json" + bytes([byte]))
    path.write_bytes(bytes(data))
    try:
        model = LLM.from_pretrained(folder, device="cpu")
    except (LLMError, ValueError, OSError) as exc:
        message = str(exc)
        assert message, "an error without a message"
        assert target in message or folder.name in message or "json" in message.lower(), message
        return
    # A flip inside tensor data or inside a JSON string can leave a loadable model: it must run.
    model.generate("hello", max_new_tokens=2)


def test_ctrl_c_during_generate_leaves_model_usable(llm: LLM) -> None:
    expected = llm.generate("The quick brown fox", max_new_tokens=24, ignore_eos=True).token_ids
    timer = threading.Timer(0.05, _thread.interrupt_main)
    # a process started in the background by a non-interactive shell ignores SIGINT, and then
    # interrupt_main does nothing: give the test Python's own Ctrl-C handler for its duration
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            for _ in range(1000):  # long enough for the interrupt to land mid-generation
                llm.generate("The quick brown fox", max_new_tokens=64, ignore_eos=True)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    again = llm.generate("The quick brown fox", max_new_tokens=24, ignore_eos=True).token_ids
    assert again == expected


def test_config_mismatching_weights_names_the_problem(checkpoint: pathlib.Path, tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = config["hidden_size"] * 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(LLMError) as info:
        LLM.from_pretrained(folder, device="cpu")
    assert "model.safetensors" in str(info.value) or "shape" in str(info.value)
