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
import dataclasses
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
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
from tb_llm.logprobs import TokenLogprob
from tb_llm.serve.api_error import (
    APIError,
    bad_request,
    not_found,
    server_error,
    too_large,
    too_many,
    unauthorized,
)
from tb_llm.serve.logprob_format import CompletionLogprobs, chat_logprobs
from tb_llm.serve.metrics import Gauge, ServerMetrics
from tb_llm.serve.request_schema import GenerationRequest, parse
from tb_llm.serve.row_sampler import RequestSampling
from tb_llm.serve.scheduler import Busy, Delta, Event, Failed, Finished, Job, Scheduler
from tb_llm.serve.settings import ServeSettings
from tb_llm.speculative import Speculative, parse_speculative

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
        self.metrics = scheduler.metrics if scheduler is not None else ServerMetrics()
        self.scheduler = scheduler or Scheduler(
            llm,
            settings.max_batch,
            settings.max_queue,
            metrics=self.metrics,
            prefix_cache_mb=settings.prefix_cache_mb,
            prefix_block_tokens=settings.prefix_block_tokens,
        )
        self.draining = False  # set on SIGTERM (http_server): new requests get 503, running ones finish
        self._add_gauges()
        self.context_length = settings.max_model_len or llm.config.max_position
        self.created = int(time.time())
        self.fingerprint = f"tb-llm-{__version__}-{llm.engine}"
        self._key = settings.api_key.encode() if settings.api_key else None
        self._default_speculative = (
            parse_speculative({"method": settings.speculative, "num_tokens": settings.draft_tokens})
            if settings.speculative not in (None, "none", "off")
            else None
        )
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/metrics", self.metrics_text, methods=["GET"]),
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

    def _add_gauges(self) -> None:
        sched = self.scheduler
        self.metrics.gauges += [
            Gauge("requests_running", "Sequences in the batch now.", lambda: sched.load[0]),
            Gauge("requests_waiting", "Sequences queued for a batch row (queue depth).", lambda: sched.load[1]),
            Gauge("batch_rows", "Rows in the batch (--max-batch).", lambda: sched.max_batch),
            Gauge(
                "kv_cache_tokens", "Tokens whose keys and values the cache holds now.", lambda: sched.engine.tokens_held
            ),
            Gauge(
                "kv_cache_capacity_tokens",
                "Tokens the cache has room for now, all rows (it grows on demand).",
                lambda: sched.engine.token_capacity,
            ),
            Gauge("kv_cache_usage_ratio", "kv_cache_tokens / kv_cache_capacity_tokens.", self._kv_usage),
            Gauge("kv_cache_bytes", "Memory the KV cache takes.", lambda: sched.engine.cache.nbytes()),
            *self._prefix_cache_metrics(),
            Gauge(
                "model_info",
                "The model served (labels); always 1.",
                lambda: 1,
                {"model": self.settings.model_name, "engine": self.llm.engine, "quant": self.llm.quant},
            ),
        ]

    def _prefix_cache_metrics(self) -> list[Gauge]:
        pc = self.scheduler.prefix_cache  # read here, written only by the scheduler thread
        return [
            Gauge(
                "prefix_cache_hits_total", "Prompts that reused cached prefix blocks.", lambda: pc.hits, kind="counter"
            ),
            Gauge(
                "prefix_cache_misses_total",
                "Prompts looked up in the prefix cache that reused nothing.",
                lambda: pc.misses,
                kind="counter",
            ),
            Gauge(
                "prefix_cache_reused_tokens_total",
                "Prompt tokens whose keys and values came from the prefix cache (not prefilled).",
                lambda: pc.tokens_reused,
                kind="counter",
            ),
            Gauge(
                "prefix_cache_evictions_total",
                "Prefix-cache blocks evicted (least recently used) to stay within the budget.",
                lambda: pc.evictions,
                kind="counter",
            ),
            Gauge("prefix_cache_bytes", "Memory the prefix cache's blocks take.", lambda: pc.bytes_held),
            Gauge("prefix_cache_blocks", "Blocks the prefix cache holds.", lambda: len(pc)),
            Gauge(
                "prefix_cache_budget_bytes",
                "The prefix cache's memory budget (--prefix-cache-mb; 0: off).",
                lambda: pc.budget_bytes,
            ),
        ]

    def info(self) -> dict[str, Any]:
        """The model's ``LLM.info()`` plus the prefix cache's state and counters."""
        pc = self.scheduler.prefix_cache.stats()
        if self.scheduler.prefix_cache_blocker is not None:
            pc["off_because"] = self.scheduler.prefix_cache_blocker
        return {**self.llm.info(), "prefix_cache": pc}

    def _kv_usage(self) -> float:
        cap = self.scheduler.engine.token_capacity
        return self.scheduler.engine.tokens_held / cap if cap else 0.0

    async def metrics_text(self, request: Request) -> Response:
        # Open like /health: scrapers seldom carry the API key, and nothing here is a secret.
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

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
        if not self.draining:  # a drained scheduler stays stopped
            self.scheduler.start()  # no-op when running; hosts that skip lifespan events start it here
        running, waiting = self.scheduler.load
        ok = self.scheduler.alive and not self.draining
        status = "draining" if self.draining else "ok" if ok else "unavailable"
        body = {"status": status, "running": running, "waiting": waiting, "prefix_cache": self.info()["prefix_cache"]}
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
        self.metrics.requests.inc()
        try:
            if self.draining:
                raise server_error("the server is shutting down; retry on another instance", 503)
            self._authorize(request)
            req = parse(
                await self._read_json(request),
                chat,
                self.settings.max_stop,
                self.settings.max_n,
                self.settings.draft_tokens,
            )
            self._check_model(req.model)
            self._bind_grammar(req)
            speculative = self._speculative(req)
            prompt_ids = await self._encode(req)
            max_tokens = self._max_tokens(req, len(prompt_ids))
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
            jobs = [
                Job(
                    prompt_ids,
                    max_tokens,
                    _choice_sampling(req.sampling, i),
                    req.stop,
                    req.ignore_eos,
                    _emitter(loop, queue, i),
                    logprobs=req.logprobs,
                    prompt_logprobs=req.echo and req.logprobs is not None,
                    speculative=speculative,
                )
                for i in range(req.n)
            ]
            try:
                self.scheduler.submit_all(jobs)
            except Busy as exc:
                self.metrics.rejected.inc()
                raise too_many(str(exc)) from None
        except APIError as err:
            return _error_response(err)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        out = _Choices(self, req, jobs, prompt_ids)
        if req.stream:
            return StreamingResponse(
                self._stream(req, out, queue, rid), media_type="text/event-stream", headers=SSE_HEADERS
            )
        return await self._complete(request, req, out, queue, rid)

    def _speculative(self, req: GenerationRequest) -> Speculative | None:
        """The request's own ``speculative``, else the server's default. Drafts are verified with
        tb-llm's sampler (temperature, top-k / top-p / min-p, repetition penalty); a request with
        OpenAI's additive penalties, ``logit_bias`` or ``response_format`` decodes plainly under
        the server's default, and is a 400 when it asked for speculation itself."""
        spec = req.speculative if req.speculative_given else self._default_speculative
        if spec is None:
            return None
        s = req.sampling
        conflict = (
            "response_format"
            if s.grammar is not None
            else "logit_bias"
            if s.logit_bias
            else "frequency_penalty"
            if s.frequency_penalty
            else "presence_penalty"
            if s.presence_penalty
            else None
        )
        if conflict is None:
            return spec
        if req.speculative_given:
            raise bad_request(f"'speculative' cannot be combined with '{conflict}'", "speculative")
        return None

    def _bind_grammar(self, req: GenerationRequest) -> None:
        """``response_format``'s schema -> the sampling's grammar for this model's tokenizer."""
        if req.response_format is None:
            return
        from tb_llm.structured import Grammar, StructuredOutputError, grammar_tokenizer

        try:
            gt = grammar_tokenizer(self.llm.tokenizer, self.llm.config.vocab_size, self.llm.eos_token_ids)
        except StructuredOutputError as exc:
            raise bad_request(str(exc), "response_format") from None
        req.sampling = dataclasses.replace(req.sampling, grammar=Grammar(gt, req.response_format))

    # -- responses ------------------------------------------------------------------------
    def _usage(self, done: list[Finished]) -> dict[str, int]:
        prompt = done[0].prompt_tokens  # one prompt, however many choices
        completion = sum(d.completion_tokens for d in done)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _complete(
        self, request: Request, req: GenerationRequest, out: _Choices, queue: asyncio.Queue[tuple[int, Event]], rid: str
    ) -> Response:
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while not out.all_done:
                get = asyncio.ensure_future(queue.get())
                await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    return Response(status_code=499)  # nobody is listening any more
                i, event = get.result()
                if isinstance(event, Failed):
                    return _error_response(server_error(event.message))
                out.record(i, event)
        finally:
            gone.cancel()
            out.cancel()
        choices = []
        for i, done in enumerate(out.finished):
            assert done is not None
            choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": done.finish_reason}
            text = "".join(out.texts[i])
            if req.chat:
                choice["message"] = {"role": "assistant", "content": text}
                if req.logprobs is not None:
                    choice["logprobs"] = chat_logprobs(out.entries[i])
            else:
                choice["text"] = (out.echo_text if req.echo else "") + text
                if req.logprobs is not None:
                    lp = CompletionLogprobs()
                    if req.echo:
                        out.add_prompt(lp, done.prompt_logprobs or ())
                    lp.extend(out.entries[i])
                    choice["logprobs"] = lp.take()
            choices.append(choice)
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if req.chat else "text_completion",
                "created": int(time.time()),
                "model": self.settings.model_name,
                "system_fingerprint": self.fingerprint,
                "choices": choices,
                "usage": self._usage([d for d in out.finished if d is not None]),
            }
        )

    async def _stream(
        self, req: GenerationRequest, out: _Choices, queue: asyncio.Queue[tuple[int, Event]], rid: str
    ) -> AsyncIterator[str]:
        created = int(time.time())
        head: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": created,
            "model": self.settings.model_name,
            "system_fingerprint": self.fingerprint,
        }
        legacy = [CompletionLogprobs() for _ in out.jobs]
        started = [False] * len(out.jobs)

        def chunk(i: int, piece: str | None, finish: str | None, entries: tuple[TokenLogprob, ...] = ()) -> str:
            choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": finish}
            if req.chat:
                delta: dict[str, Any] = {}
                if not started[i]:
                    delta["role"] = "assistant"
                if piece is not None:
                    delta["content"] = piece
                choice["delta"] = delta
                if req.logprobs is not None and entries:
                    choice["logprobs"] = chat_logprobs(entries)
            else:
                choice["text"] = piece or ""
                if req.logprobs is not None:
                    legacy[i].extend(entries)
                    fresh = legacy[i].take()
                    if fresh["tokens"]:
                        choice["logprobs"] = fresh
            started[i] = True
            body: dict[str, Any] = {**head, "choices": [choice]}
            if req.include_usage:
                body["usage"] = None
            return _sse(body)

        try:
            for i in range(len(out.jobs)):
                if req.chat:
                    yield chunk(i, "", None)
            while not out.all_done:
                i, event = await queue.get()
                if not req.chat and req.echo and not started[i]:
                    # The prompt's log-probs are set at prefill, before this choice's first event.
                    if req.logprobs is not None:
                        out.add_prompt(legacy[i], out.jobs[i].prompt_entries or ())
                    yield chunk(i, out.echo_text, None)
                if isinstance(event, Failed):
                    yield _sse(server_error(event.message).body())
                    break
                out.record(i, event)
                if isinstance(event, Delta):
                    yield chunk(i, event.text, None, event.logprobs)
                else:
                    yield chunk(i, None if req.chat else "", event.finish_reason)
            else:
                if req.include_usage:
                    yield _sse({**head, "choices": [], "usage": self._usage([d for d in out.finished if d])})
            yield "data: [DONE]\n\n"
        finally:
            out.cancel()  # a no-op when finished; frees the rows when the client went away


class _Choices:
    """The ``n`` jobs of one request and what each has produced so far."""

    def __init__(self, server: OpenAIServer, req: GenerationRequest, jobs: list[Job], prompt_ids: list[int]) -> None:
        self.jobs = jobs
        self.prompt_ids = prompt_ids
        self.texts: list[list[str]] = [[] for _ in jobs]
        self.entries: list[list[TokenLogprob]] = [[] for _ in jobs]
        self.finished: list[Finished | None] = [None] * len(jobs)
        self.pieces = server.scheduler.pieces
        self.echo_text = ""
        if req.echo:
            tok = server.llm.tokenizer
            if isinstance(req.prompt, str):
                self.echo_text = req.prompt
            elif tok is not None:
                self.echo_text = tok.decode(prompt_ids)

    @property
    def all_done(self) -> bool:
        return all(f is not None for f in self.finished)

    def record(self, i: int, event: Event) -> None:
        if isinstance(event, Delta):
            self.texts[i].append(event.text)
            self.entries[i].extend(event.logprobs)
        elif isinstance(event, Finished):
            self.finished[i] = event

    def add_prompt(self, lp: CompletionLogprobs, entries: Sequence[TokenLogprob]) -> None:
        lp.add_unscored(self.pieces.text(self.prompt_ids[0]))  # nothing predicts the first token
        lp.extend(entries)

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()


def _choice_sampling(sampling: RequestSampling, i: int) -> RequestSampling:
    """Choice ``i`` samples with seed ``seed + i``: choice 0 is the ``n=1`` request, and each
    choice is reproducible on its own (as ``LLM.generate(n=..., seed=...)``)."""
    if sampling.seed is None or i == 0:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + i) % (1 << 64))


def _emitter(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[int, Event]], i: int) -> Any:
    def emit(event: Event) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (i, event))

    return emit


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
