"""``python -m tb_llm serve`` as a real process (API key from ``TORCHBURN_API_KEY``), and the
``serve`` sub-command through ``torchburn llm``."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_python_dash_m_serve(llama_dir: Path) -> None:
    port = _free_port()
    env = {**os.environ, "TORCHBURN_API_KEY": "env-key"}
    cmd = [sys.executable, "-m", "tb_llm", "serve", "--model", str(llama_dir), "--device", "cpu"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--max-batch", "4", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=url + "/v1", api_key="env-key", max_retries=0, timeout=60)
        (model,) = client.models.list().data
        assert model.id == llama_dir.name
        r = client.chat.completions.create(model=model.id, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert r.usage is not None and 1 <= r.usage.completion_tokens <= 4
        # The path the model was loaded from is accepted as its id too.
        client.completions.create(model=str(llama_dir), prompt="Hi", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="other", max_retries=0).models.list()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it so the exit status tells why.
    assert proc.returncode in (0, -signal.SIGTERM), proc.stdout.read() if proc.stdout else ""


def test_torchburn_llm_serve_is_registered() -> None:
    from tb_llm import plugin

    (cmd,) = plugin.tb_register_commands()
    parser = argparse.ArgumentParser(prog="torchburn llm")
    assert cmd.add_arguments is not None
    cmd.add_arguments(parser)
    args = parser.parse_args(["serve", "--model", "m", "--api-key", "k", "--max-batch", "3", "--port", "9"])
    assert (args.llm_command, args.api_key, args.max_batch, args.host) == ("serve", "k", 3, "127.0.0.1")


def test_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from tb_llm.serve.settings import ServeSettings

    monkeypatch.setenv("TORCHBURN_API_KEY", "from-env")
    assert ServeSettings.api_key_from_env(None) == "from-env"
    assert ServeSettings.api_key_from_env("flag") == "flag"
    monkeypatch.setenv("TORCHBURN_API_KEY", "")
    assert ServeSettings.api_key_from_env(None) is None
