"""Running the app under uvicorn: in the foreground (the CLI) or on a background thread
(tests, notebooks, embedding in another program)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from tb_llm.llm import LLM
from tb_llm.serve.app import OpenAIServer
from tb_llm.serve.settings import ServeSettings


def _uvicorn_config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    # One process, one event loop: the model lives in this process's scheduler thread. Scale out
    # with several processes behind a load balancer (docs/serving.md), not uvicorn workers.
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)


def serve(
    llm: LLM, settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Serve ``llm`` until interrupted (Ctrl-C / SIGTERM stop it gracefully)."""
    server = OpenAIServer(llm, settings)
    uvicorn.Server(_uvicorn_config(server.app, host, port, log_level)).run()


class BackgroundServer:
    """The server on a background thread, on an ephemeral loopback port by default.

    with BackgroundServer(llm, settings) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="...")
    """

    def __init__(
        self, llm: LLM, settings: ServeSettings, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        self.openai_server = OpenAIServer(llm, settings)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self._server = uvicorn.Server(_uvicorn_config(self.openai_server.app, host, self.port, log_level))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def scheduler(self) -> Any:
        return self.openai_server.scheduler

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="tb-llm-uvicorn", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.openai_server.scheduler.stop()
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
