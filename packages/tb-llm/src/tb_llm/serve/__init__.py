"""An OpenAI-compatible HTTP server for tb-llm with continuous batching.

from tb_llm import LLM
from tb_llm.serve import ServeSettings, create_app
app = create_app(LLM.from_pretrained("path/to/model"), ServeSettings(model_name="my-model"))
# any ASGI server: uvicorn.run(app, host="127.0.0.1", port=8000)

Needs the ``serve`` extra (``pip install 'tb-llm[serve]'``): Starlette and uvicorn.
"""

from __future__ import annotations

from typing import Any

from tb_llm.serve.settings import ServeSettings

__all__ = ["BackgroundServer", "OpenAIServer", "Scheduler", "ServeSettings", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    # Starlette / uvicorn load only when used, so `tb_llm.serve.cli` stays importable without them.
    if name in ("OpenAIServer", "create_app"):
        from tb_llm.serve import app

        return getattr(app, name)
    if name in ("BackgroundServer", "serve"):
        from tb_llm.serve import http_server

        return getattr(http_server, name)
    if name == "Scheduler":
        from tb_llm.serve.scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'tb_llm.serve' has no attribute {name!r}")
