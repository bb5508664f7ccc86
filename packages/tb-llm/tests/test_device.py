"""``device=`` choices: what runs where, and a clear error when nothing can serve the request."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tb_llm import LLM, backends
from tb_llm.errors import BackendError
from tb_llm.testing import make_checkpoint

pytest.importorskip("transformers", reason="the tiny checkpoint is built with transformers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("device") / "model")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_device_gpu_without_any_gpu_is_a_clear_error(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "_other_plugins_installed", lambda: False)  # no engine backends at all
    with pytest.raises(BackendError, match=r"device='gpu' but PyTorch sees no GPU .* no GPU engine backend"):
        LLM.from_pretrained(folder, device="gpu")


def test_device_cpu_and_auto_run_on_the_host(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "_other_plugins_installed", lambda: False)
    for device in ("cpu", "auto") if not torch.cuda.is_available() else ("cpu",):
        llm = LLM.from_pretrained(folder, device=device)
        assert llm.model.device.type == "cpu" and llm.backend.name == "reference"


def test_unknown_device_names_the_choices(folder: Path) -> None:
    with pytest.raises(BackendError, match="use 'auto', 'cpu' or 'gpu'"):
        LLM.from_pretrained(folder, device="tpu")
