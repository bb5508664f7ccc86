"""A bounded load test: 32 concurrent streaming clients on loopback, a fixed number of requests.

Asserts that every response completed in full and that requests shared decode steps; prints
total throughput and time-to-first-token percentiles (measured, not asserted: the machine is
shared). ``pytest -s`` shows the figures.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from tb_llm import LLM  # noqa: E402
from tb_llm.serve import BackgroundServer, ServeSettings  # noqa: E402

CLIENTS = 32
REQUESTS = 96  # 3 per client
TOKENS = 32
PROMPTS = ["Hello", "The quick brown fox", "Grüße aus München", "def main():", "日本語のテキスト", "TorchBurn runs"]


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def _load(url: str) -> tuple[list[float], list[int], list[str], float]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ttft: list[float] = []
    tokens: list[int] = []
    finish: list[str] = []
    todo = list(range(REQUESTS))

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        first = None
        stream = await client.chat.completions.create(
            model="load",
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_tokens=TOKENS,
            temperature=0.7,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - t0
            if chunk.choices and chunk.choices[0].finish_reason:
                finish.append(chunk.choices[0].finish_reason)
            if chunk.usage is not None:
                tokens.append(chunk.usage.completion_tokens)
        ttft.append(first if first is not None else time.perf_counter() - t0)

    async def worker() -> None:
        while todo:
            await one(todo.pop())

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CLIENTS)))
    wall = time.perf_counter() - t0
    await client.close()
    return ttft, tokens, finish, wall


def test_32_concurrent_streaming_clients(llama: LLM) -> None:
    settings = ServeSettings(model_name="load", max_batch=CLIENTS, max_queue=CLIENTS)
    with BackgroundServer(llama, settings) as srv:
        ttft, tokens, finish, wall = asyncio.run(asyncio.wait_for(_load(srv.url), timeout=300))
        sched = srv.scheduler
        peak, steps = sched.peak_batch, sched.steps
    assert len(ttft) == len(tokens) == len(finish) == REQUESTS
    assert tokens == [TOKENS] * REQUESTS
    assert finish == ["length"] * REQUESTS
    assert peak > 1  # requests were batched together, not served one after another
    total = sum(tokens)
    print(
        f"\nload: {CLIENTS} streaming clients, {REQUESTS} requests x {TOKENS} tokens in {wall:.2f} s: "
        f"{total / wall:.0f} tok/s total; TTFT p50 {1000 * statistics.median(ttft):.0f} ms, "
        f"p95 {1000 * _percentile(ttft, 0.95):.0f} ms; peak batch {peak}, {steps} decode steps "
        f"({total / max(steps, 1):.1f} tokens per step)"
    )
