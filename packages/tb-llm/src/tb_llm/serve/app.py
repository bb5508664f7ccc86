"""The ASGI application: OpenAI's ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models`` and ``/health`` on Starlette, in front of the batching :class:`Scheduler`.

Each request gets its own asyncio queue that the scheduler thread fills through
``loop.call_soon_threadsafe``; a slow reader only lets its own queue grow (at most one entry per
generated token), and a client that goes away cancels its job, which frees its batch row at
the next step boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tb_llm._version import __version__
from tb_llm.errors import LLMError
from tb_llm.llm import LLM
from tb_llm.serve.api_error import (
    APIError,
    bad_request,
    not_found,
    server_error,
    too_large,
    too_many,
    unauthorized,
)
from tb_llm.serve.request_schema import GenerationRequest, parse
from tb_llm.serve.scheduler import Busy, Delta, Event, Failed, Finished, Job, Scheduler
from tb_llm.serve.settings import ServeSettings

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _error_response(err: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class OpenAIServer:
    """Holds the model, the scheduler and the settings; ``.app`` is the ASGI application."""

    def __init__(self, llm: LLM, settings: ServeSettings, scheduler: Scheduler | None = None) -> None:
        self.llm = llm
        self.settings = settings
        self.scheduler = scheduler or Scheduler(llm, settings.max_batch, settings.max_queue)
        self.context_length = settings.max_model_len or llm.config.max_position
        self.created = int(time.time())
        self.fingerprint = f"tb-llm-{__version__}-{llm.engine}"
        self._key = settings.api_key.encode() if settings.api_key else None
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
            ],
            exception_handlers={HTTPException: self._http_exception, Exception: self._unexpected},
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.scheduler.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(self.scheduler.stop)

    async def _http_exception(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return _error_response(not_found(f"no route {request.method} {request.url.path}", code="not_found"))
        if exc.status_code == 405:
            return _error_response(APIError(405, f"method {request.method} not allowed on {request.url.path}"))
        return _error_response(APIError(exc.status_code, str(exc.detail)))

    async def _unexpected(self, request: Request, exc: Exception) -> Response:
        return _error_response(server_error(f"internal error: {type(exc).__name__}"))

    # -- checks ---------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if self._key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header or scheme.lower() != "bearer" or not token.strip():
            raise unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        if not hmac.compare_digest(token.strip().encode(), self._key):
            raise unauthorized("incorrect API key provided")

    async def _read_json(self, request: Request) -> Any:
        limit = self.settings.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise too_large(f"request body is {length} bytes; the limit is {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(f"could not parse the request body as JSON: {exc}") from None

    def _check_model(self, model: str | None) -> None:
        if model is None or model == self.settings.model_name or model in self.settings.aliases:
            return
        raise not_found(
            f"the model '{model}' does not exist; this server serves '{self.settings.model_name}'",
            "model",
            "model_not_found",
        )

    async def _encode(self, req: GenerationRequest) -> list[int]:
        try:
            ids = await anyio.to_thread.run_sync(self.llm.encode, req.prompt)
        except (LLMError, ValueError, TypeError) as exc:
            raise bad_request(str(exc), req.prompt_param) from None
        vocab = self.llm.config.vocab_size
        if not ids:
            raise bad_request("the prompt encodes to no tokens", req.prompt_param)
        if any(t >= vocab for t in ids):
            raise bad_request(f"token ids must be below the vocabulary size {vocab}", req.prompt_param)
        return ids

    def _max_tokens(self, req: GenerationRequest, prompt_tokens: int) -> int:
        ctx = self.context_length
        room = ctx - prompt_tokens
        if room <= 0 or (req.max_tokens is not None and req.max_tokens > room):
            asked = req.max_tokens if req.max_tokens is not None else 1
            raise bad_request(
                f"this model's maximum context length is {ctx} tokens; you requested {prompt_tokens + asked} "
                f"tokens ({prompt_tokens} in the {req.prompt_param}, {asked} in the completion). "
                "Reduce the length of the prompt or max_tokens.",
                req.prompt_param,
                "context_length_exceeded",
            )
        if req.max_tokens is not None:
            return req.max_tokens
        return room if req.chat else min(self.settings.default_max_tokens, room)

    # -- routes ---------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        self.scheduler.start()  # no-op when running; hosts that skip lifespan events start it here
        running, waiting = self.scheduler.load
        ok = self.scheduler.alive
        body = {"status": "ok" if ok else "unavailable", "running": running, "waiting": waiting}
        return JSONResponse(body, status_code=200 if ok else 503)

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.settings.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "torchburn",
            "max_model_len": self.context_length,
        }

    async def models(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except APIError as err:
            return _error_response(err)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        try:
            self._authorize(request)
            self._check_model(request.path_params["model_id"])
        except APIError as err:
            return _error_response(err)
        return JSONResponse(self._model_card())

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool) -> Response:
        try:
            self._authorize(request)
            req = parse(await self._read_json(request), chat, self.settings.max_stop)
            self._check_model(req.model)
            prompt_ids = await self._encode(req)
            max_tokens = self._max_tokens(req, len(prompt_ids))
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[Event] = asyncio.Queue()

            def emit(event: Event) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, event)

            job = Job(prompt_ids, max_tokens, req.sampling, req.stop, req.ignore_eos, emit)
            try:
                self.scheduler.submit(job)
            except Busy as exc:
                raise too_many(str(exc)) from None
        except APIError as err:
            return _error_response(err)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if req.stream:
            return StreamingResponse(
                self._stream(req, job, queue, rid), media_type="text/event-stream", headers=SSE_HEADERS
            )
        return await self._complete(request, req, job, queue, rid)

    # -- responses ------------------------------------------------------------------------
    def _usage(self, done: Finished) -> dict[str, int]:
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
        }

    async def _complete(
        self, request: Request, req: GenerationRequest, job: Job, queue: asyncio.Queue[Event], rid: str
    ) -> Response:
        parts: list[str] = []
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                get = asyncio.ensure_future(queue.get())
                await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    return Response(status_code=499)  # nobody is listening any more
                event = get.result()
                if isinstance(event, Delta):
                    parts.append(event.text)
                elif isinstance(event, Failed):
                    return _error_response(server_error(event.message))
                else:
                    break
        finally:
            gone.cancel()
            job.cancel()
        text = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": event.finish_reason}
        if req.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if req.chat else "text_completion",
                "created": int(time.time()),
                "model": self.settings.model_name,
                "system_fingerprint": self.fingerprint,
                "choices": [choice],
                "usage": self._usage(event),
            }
        )

    async def _stream(
        self, req: GenerationRequest, job: Job, queue: asyncio.Queue[Event], rid: str
    ) -> AsyncIterator[str]:
        created = int(time.time())
        head: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": created,
            "model": self.settings.model_name,
            "system_fingerprint": self.fingerprint,
        }

        def chunk(piece: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if req.chat:
                delta: dict[str, Any] = {}
                if first:
                    delta["role"] = "assistant"
                if piece is not None:
                    delta["content"] = piece
                choice["delta"] = delta
            else:
                choice["text"] = piece or ""
            out: dict[str, Any] = {**head, "choices": [choice]}
            if req.include_usage:
                out["usage"] = None
            return out

        try:
            if req.chat:
                yield _sse(chunk("", None, first=True))
            while True:
                event = await queue.get()
                if isinstance(event, Delta):
                    yield _sse(chunk(event.text, None))
                elif isinstance(event, Failed):
                    yield _sse(server_error(event.message).body())
                    break
                else:
                    yield _sse(chunk(None if req.chat else "", event.finish_reason))
                    if req.include_usage:
                        yield _sse({**head, "choices": [], "usage": self._usage(event)})
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()  # a no-op when finished; frees the row when the client went away


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (the body has been read, so only that can arrive)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(llm: LLM, settings: ServeSettings | None = None) -> Starlette:
    """The ASGI app serving ``llm`` (mount it, or hand it to any ASGI server)."""
    settings = settings or ServeSettings(model_name=llm.path.name)
    return OpenAIServer(llm, settings).app
