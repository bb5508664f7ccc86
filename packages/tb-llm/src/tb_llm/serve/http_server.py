"""Running the app under uvicorn: in the foreground (the CLI) or on a background thread
(tests, notebooks, embedding in another program)."""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import threading
import time
from types import FrameType
from typing import Any

import anyio.to_thread
import uvicorn

from tb_llm.llm import LLM
from tb_llm.serve.app import OpenAIServer
from tb_llm.serve.settings import ServeSettings

# uvicorn configures its own loggers (level, format); the drain reports beside its shutdown lines
log = logging.getLogger("uvicorn.error")

# After the drain timeout the scheduler ends what still runs (each gets an error); this is how
# long those last responses get to reach their clients before uvicorn cancels them.
FLUSH_SECONDS = 5.0


def _uvicorn_config(app: Any, host: str, port: int, log_level: str, graceful_seconds: float = 5.0) -> uvicorn.Config:
    # One process, one event loop: the model lives in this process's scheduler thread. Scale out
    # with several processes behind a load balancer (docs/serving.md), not uvicorn workers.
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(graceful_seconds),
    )


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain on SIGTERM (what an orchestrator sends before it kills a process):

    1. stop accepting: the listening socket closes (new connections are refused), idle
       keep-alive connections close, and a request that still arrives gets 503 (``/health``
       too, so a load balancer takes the process out);
    2. let running requests finish, for up to ``drain_timeout`` seconds;
    3. end what is still running then (each client gets the error "the server is shutting
       down", a streamed one as an error event and ``[DONE]``), and exit with status 0.

    A second SIGTERM, or Ctrl-C during the drain, exits at once. Ctrl-C alone drains the same way
    but exits as an interrupt, as uvicorn does.
    """

    def __init__(self, config: uvicorn.Config, app_server: OpenAIServer, drain_timeout: float) -> None:
        super().__init__(config)
        self.app_server = app_server
        self.drain_timeout = drain_timeout

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:  # a second signal: no more waiting
            self.force_exit = True
            return
        if sig == signal.SIGTERM:
            # Not recorded as captured: uvicorn would raise it again after the shutdown, and the
            # process would end "killed by SIGTERM" instead of exiting 0 after a clean drain.
            self.app_server.draining = True
            self.should_exit = True
            return
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.app_server.draining = True
        running, waiting = self.app_server.scheduler.load
        log.info("draining: %d running, %d waiting; up to %.0f s", running, waiting, self.drain_timeout)
        expire = asyncio.ensure_future(self._expire())
        try:
            await super().shutdown(sockets)
        finally:
            expire.cancel()

    async def _expire(self) -> None:
        await asyncio.sleep(self.drain_timeout)
        running, waiting = self.app_server.scheduler.load
        if running or waiting:
            log.warning("drain timeout: ending %d running and %d waiting requests", running, waiting)
        await anyio.to_thread.run_sync(self.app_server.scheduler.stop)


def serve(
    llm: LLM, settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Serve ``llm`` until interrupted. SIGTERM drains (see :class:`DrainingServer`): no new
    requests, running ones get ``settings.drain_timeout`` seconds, then the process exits 0."""
    server = OpenAIServer(llm, settings)
    config = _uvicorn_config(server.app, host, port, log_level, settings.drain_timeout + FLUSH_SECONDS)
    DrainingServer(config, server, settings.drain_timeout).run()


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
