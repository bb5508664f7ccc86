"""CLI smoke tests, the `torchburn llm` command, and engine backends through tb_register_llm_backends."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tb_llm import LLM, BackendError
from tb_llm.backends import ReferenceBackend


def test_cli_generate_and_benchmark(llama_dir: Path) -> None:
    # One process for both sub-commands keeps the suite fast (torch imports once). The benchmark
    # names its engine so the report is the same whichever engine packages are installed.
    code = (
        "import sys; from tb_llm.cli import main;"
        f"r1 = main(['generate', '--model', {str(llama_dir)!r}, '--device', 'cpu', '--tokens', '6', '--stream', 'Hello']);"
        f"r2 = main(['benchmark', '--model', {str(llama_dir)!r}, '--quant', 'int4', '--engine', 'reference', '--tokens', '4', '--prompt-tokens', '16', '--repeat', '1']);"
        f"r3 = main(['generate', '--model', {str(llama_dir / 'nope')!r}, 'x']);"
        "print('RC', r1, r2, r3)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.returncode == 0, out.stderr
    assert "RC 0 0 2" in out.stdout
    assert "6 tokens, length" in out.stderr
    for word in ("prefill", "decode", "ms/token", "memory", "engine     reference"):
        assert word in out.stdout
    assert "no such local folder" in out.stderr


def test_python_dash_m_help() -> None:
    out = subprocess.run([sys.executable, "-m", "tb_llm", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "chat" in out.stdout and "benchmark" in out.stdout


def test_torchburn_llm_command(llama_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tb_llm import plugin
    from torchburn.cli.command import Command

    assert plugin.PLUGIN_API_VERSION == 1
    (cmd,) = plugin.tb_register_commands()
    assert isinstance(cmd, Command) and cmd.name == "llm"
    parser = argparse.ArgumentParser(prog="torchburn llm")
    assert cmd.add_arguments is not None
    cmd.add_arguments(parser)
    args = parser.parse_args(["generate", "--model", str(llama_dir), "--device", "cpu", "--tokens", "3", "Hi"])
    assert cmd.run(args) == 0
    assert "3 tokens" in capsys.readouterr().err
    # And through the `torchburn` command itself, which finds the entry point.
    from torchburn.cli import main

    assert main(["llm", "generate", "--model", str(llama_dir), "--device", "cpu", "--tokens", "2", "Hi"]) == 0
    assert "2 tokens" in capsys.readouterr().err


def test_entry_point_is_declared() -> None:
    from importlib import metadata

    eps = [ep for ep in metadata.entry_points(group="torchburn") if ep.name == "llm"]
    assert eps and eps[0].value == "tb_llm.plugin"


class _CountingBackend(ReferenceBackend):
    name = "counting"
    calls = 0

    def linear(self, x, handle, bias):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        return super().linear(x, handle, bias)


class _Plugin:
    PLUGIN_API_VERSION = 1

    @staticmethod
    def tb_register_llm_backends():  # type: ignore[no-untyped-def]
        from torchburn.llm import LLMBackend

        return [
            LLMBackend(
                name="counting",
                engine="counting_engine",
                device="cpu",
                load=lambda: _CountingBackend("cpu"),
                priority=5,
                protocol_version=2,
            )
        ]


def test_engine_backend_is_used(llama_dir: Path, llama: LLM) -> None:
    import torchburn

    torchburn.hookimpl(_Plugin.tb_register_llm_backends)
    torchburn.register_plugin(_Plugin, name="counting-test")
    try:
        llm = LLM.from_pretrained(llama_dir, device="cpu", engine="counting_engine")
        assert llm.engine == "counting"
        g = llm.generate("Hello", max_new_tokens=5, ignore_eos=True)
        assert _CountingBackend.calls > 0
        assert g.token_ids == llama.generate("Hello", max_new_tokens=5, ignore_eos=True).token_ids
        with pytest.raises(BackendError, match="engine 'nope' offers no LLM backend"):
            LLM.from_pretrained(llama_dir, device="cpu", engine="nope")
    finally:
        torchburn.unregister_plugin("counting-test")


def test_named_engine_gets_host_tensors_where_pytorch_sees_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found on an H200 machine: with PyTorch seeing CUDA, device='auto' resolved to cuda and a named
    engine backend (wgpu) was handed CUDA tensors, which it cannot read. A named engine computes on
    host tensors; asking for it together with an explicit PyTorch device is refused."""
    import torch

    import torchburn
    from tb_llm import backends

    torchburn.hookimpl(_Plugin.tb_register_llm_backends)
    torchburn.register_plugin(_Plugin, name="counting-test")
    monkeypatch.setattr(backends, "_other_plugins_installed", lambda: True)
    try:
        cuda = torch.device("cuda")
        for requested in ("auto", "gpu"):
            backend = backends.select_backend(cuda, "counting_engine", requested=requested)
            assert backend.device == torch.device("cpu")
        with pytest.raises(BackendError, match="computes on host tensors"):
            backends.select_backend(cuda, "counting_engine", requested="cuda")
        # without a named engine a PyTorch GPU device keeps PyTorch's own kernels on it
        assert backends.select_backend(cuda, None, requested="auto").device == cuda
    finally:
        torchburn.unregister_plugin("counting-test")


class _FusedBackend(ReferenceBackend):
    """A backend that takes over the whole step (here: by running the description's forward pass
    over its own kernels), given tb-core's ModelDescription, never the Decoder."""

    name = "fused"
    steps = 0

    def compile_model(self, model):  # type: ignore[no-untyped-def]
        from torchburn.llm import ModelDescription, forward

        assert isinstance(model, ModelDescription)

        def step(ids, positions, cache, last_only):  # type: ignore[no-untyped-def]
            type(self).steps += 1
            return forward(model, self, ids, positions, cache, last_only)

        return step


def test_fused_step_backend(llama_dir: Path, llama: LLM) -> None:
    from tb_llm.llm import LLM as _LLM
    from tb_llm.model import Decoder

    base = llama.model
    model = Decoder(base.cfg, _weights(llama_dir), _FusedBackend("cpu"), "fp32")
    fused = _LLM(model, llama.tokenizer, llama.path, "fp32", 0.0)
    g = fused.generate("Hello", max_new_tokens=6, ignore_eos=True)
    assert _FusedBackend.steps == 6  # one prefill + five decode steps, each one call
    assert g.token_ids == llama.generate("Hello", max_new_tokens=6, ignore_eos=True).token_ids


def _weights(folder: Path):  # type: ignore[no-untyped-def]
    from tb_llm.safetensors_io import CheckpointWeights

    return CheckpointWeights(folder)
