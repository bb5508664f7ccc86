"""Graceful drain on SIGTERM: the real ``python -m tb_llm serve`` process in a subprocess, and the
drain timeout in process (a slowed model)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from tb_llm import LLM
from tb_llm.serve import ServeSettings
from tb_llm.serve.app import OpenAIServer
from tb_llm.serve.http_server import DrainingServer, _uvicorn_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"the server exited early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}"
            )
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not become healthy")


def _refused_or_503(base: str) -> str:
    """A new request after SIGTERM: refused at connect, or answered 503."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=10)
    try:
        client.completions.create(model="m", prompt="Hello", max_tokens=2)
    except openai.APIConnectionError:
        return "refused"
    except openai.APIStatusError as exc:
        assert exc.status_code == 503, exc
        return "503"
    raise AssertionError("a request after SIGTERM was served")


def test_sigterm_lets_the_running_stream_finish_refuses_new_requests_and_exits_0(llama_dir: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "tb_llm", "serve", "--model", str(llama_dir), "--device", "cpu", "--threads", "1"]
    cmd += ["--port", str(port), "--served-model-name", "m", "--drain-timeout", "60", "--log-level", "info"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_healthy(base, proc)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        new_tokens = 1500
        stream = client.completions.create(
            model="m",
            prompt="Hello",
            max_tokens=new_tokens,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        first = next(chunks)  # the request is running
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        time.sleep(0.5)  # the signal is handled on the server's next loop tick
        assert _refused_or_503(base) in ("refused", "503")
        rest = list(chunks)
        finish = [c.choices[0].finish_reason for c in [first, *rest] if c.choices and c.choices[0].finish_reason]
        assert finish == ["length"]  # the whole completion, not cut short
        text = "".join(c.choices[0].text for c in [first, *rest] if c.choices)
        want = LLM.from_pretrained(llama_dir, device="cpu").generate(
            "Hello", max_new_tokens=new_tokens, ignore_eos=True
        )
        assert not isinstance(want, list)
        assert text == want.text
        rc = proc.wait(timeout=30)
        elapsed = time.monotonic() - sent
        err = proc.stderr.read() if proc.stderr else ""
        assert rc == 0, err
        assert elapsed < 60, elapsed
        assert "draining: 1 running" in err, err  # the stream was still running when the drain began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _SlowEngine:
    """Wraps the batch engine so each decode step takes ``delay`` seconds."""

    def __init__(self, engine: object, delay: float) -> None:
        self._engine, self._delay = engine, delay

    def decode(self, tokens: list[int]) -> torch.Tensor:
        time.sleep(self._delay)
        return self._engine.decode(tokens)  # type: ignore[attr-defined, no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)


def test_drain_timeout_ends_what_still_runs_with_an_error(llama: LLM) -> None:
    settings = ServeSettings(model_name="m", drain_timeout=0.5, prefix_cache_mb=0)
    app_server = OpenAIServer(llama, settings)
    app_server.scheduler.engine = _SlowEngine(app_server.scheduler.engine, 0.05)  # type: ignore[assignment]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = _uvicorn_config(app_server.app, "127.0.0.1", 0, "warning", settings.drain_timeout + 5)
    server = DrainingServer(config, app_server, settings.drain_timeout)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        events: list[str] = []
        with httpx.Client(timeout=30) as http:
            body = {"model": "m", "prompt": "Hello", "max_tokens": 400, "stream": True, "ignore_eos": True}
            with http.stream("POST", base + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                events.append(next(line for line in lines if line.startswith("data: ")))
                server.handle_exit(signal.SIGTERM, None)  # what the signal handler does (main thread only)
                began = time.monotonic()
                assert app_server.draining
                with contextlib.suppress(httpx.TransportError):  # refused or closed once draining began
                    assert httpx.get(base + "/health", timeout=5).status_code == 503
                events += [line for line in lines if line.startswith("data: ")]
        thread.join(15)
        assert not thread.is_alive(), "the server did not exit"
        took = time.monotonic() - began
        assert took < settings.drain_timeout + 5, took
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))
        assert "shutting down" in error["error"]["message"]
        finished = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
        assert len(finished) < 400  # cut short: 400 tokens at 50 ms a step would take 20 s
        assert not any(c["choices"][0]["finish_reason"] for c in finished)
    finally:
        server.should_exit = server.force_exit = True
        thread.join(15)
        app_server.scheduler.stop()
        sock.close()


def test_draining_server_answers_503(llama: LLM) -> None:
    from starlette.testclient import TestClient

    app_server = OpenAIServer(llama, ServeSettings(model_name="m", prefix_cache_mb=0))
    with TestClient(app_server.app) as client:
        assert client.get("/health").status_code == 200
        app_server.draining = True
        r = client.post("/v1/completions", json={"model": "m", "prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
        h = client.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "draining"


def test_cli_rejects_negative_drain_timeout_and_prefix_budget(
    llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tb_llm.cli import main

    assert main(["serve", "--model", str(llama_dir), "--drain-timeout", "-1"]) == 2
    assert "--drain-timeout" in capsys.readouterr().err
    assert main(["serve", "--model", str(llama_dir), "--prefix-cache-mb", "-5"]) == 2
    assert "--prefix-cache-mb" in capsys.readouterr().err
