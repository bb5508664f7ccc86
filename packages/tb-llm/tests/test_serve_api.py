"""The HTTP server on loopback, driven by the real ``openai`` client (and raw ``httpx`` where a
client library would refuse to send the malformed request)."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from tb_llm import LLM  # noqa: E402
from tb_llm.serve import BackgroundServer, ServeSettings  # noqa: E402

KEY = "test-key-0123456789"
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(llama: LLM) -> Iterator[BackgroundServer]:
    settings = ServeSettings(model_name=MODEL, api_key=KEY, max_batch=8, max_body_bytes=64 * 1024, max_model_len=256)
    with BackgroundServer(llama, settings) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _generate(llm: LLM, prompt: object, **kw: object):  # type: ignore[no-untyped-def]
    g = llm.generate(prompt, **kw)  # type: ignore[arg-type]
    assert not isinstance(g, list)
    return g


def test_health_and_models(server: BackgroundServer, client: openai.OpenAI) -> None:
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_greedy_equals_generate(llama: LLM, client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    want = _generate(llama, messages, max_new_tokens=24)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage is not None
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_greedy_equals_generate(llama: LLM, client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=20, temperature=0)
    want = _generate(llama, "The quick brown fox", max_new_tokens=20)
    assert r.object == "text_completion"
    assert r.choices[0].text == want.text
    assert r.usage is not None and r.usage.completion_tokens == len(want.token_ids)
    # Token-id prompts work too.
    ids = llama.encode("The quick brown fox")
    r2 = client.completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0)
    assert r2.choices[0].text == want.text


def test_concurrent_greedy_requests_equal_generate(llama: LLM, client: openai.OpenAI) -> None:
    prompts = ["Hello", "Grüße aus München", "def main():", "日本語", "TorchBurn runs", "The lazy dog"]

    def one(i: int) -> str:
        r = client.completions.create(
            model=MODEL, prompt=prompts[i], max_tokens=16 + i, temperature=0, extra_body={"ignore_eos": True}
        )
        return r.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(one, range(len(prompts))))
    for i, p in enumerate(prompts):
        assert got[i] == _generate(llama, p, max_new_tokens=16 + i, ignore_eos=True).text, p


def test_seeded_sampling_equals_generate(llama: LLM, client: openai.OpenAI) -> None:
    kw = dict(temperature=0.8, top_p=0.9, seed=7)
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=20, extra_body={"top_k": 50}, **kw)  # type: ignore[arg-type]
    want = _generate(llama, "Hello", max_new_tokens=20, top_k=50, **kw)
    assert r.choices[0].text == want.text
    # Penalties and logit_bias are accepted and change the choice.
    banned = llama.encode("Hello")  # ban everything greedy would pick first
    first = _generate(llama, "Hello", max_new_tokens=1, ignore_eos=True).token_ids[0]
    r = client.completions.create(
        model=MODEL, prompt=banned, max_tokens=1, temperature=0, logit_bias={str(first): -100}, frequency_penalty=1.0
    )
    assert r.usage is not None and r.usage.completion_tokens == 1
    assert (
        r.choices[0].text != _generate(llama, "Hello", max_new_tokens=1, ignore_eos=True).text
        or first in llama.eos_token_ids
    )


def test_stop_strings(llama: LLM, client: openai.OpenAI) -> None:
    full = _generate(llama, "Hello", max_new_tokens=30, ignore_eos=True).text
    stop = full[8:12]
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.find(stop)]


def test_chat_streaming(llama: LLM, client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Hello there"}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    want = _generate(llama, messages, max_new_tokens=24)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [want.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_completion_streaming_raw_sse(server: BackgroundServer, llama: LLM) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 12, "temperature": 0, "stream": True}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    import json

    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == _generate(llama, "Hello", max_new_tokens=12).text


def _error(exc: pytest.ExceptionInfo) -> dict:  # type: ignore[type-arg]
    body = exc.value.body
    assert set(body) == {"message", "type", "param", "code"}, body  # the openai client unwraps "error"
    return body  # type: ignore[no-any-return]


def test_errors_through_the_client(server: BackgroundServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="Hello", max_tokens=4)
    assert _error(e)["code"] == "model_not_found" and _error(e)["param"] == "model"

    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hello " * 300, max_tokens=4)
    assert _error(e)["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1000)
    assert _error(e)["code"] == "context_length_exceeded" and _error(e)["param"] == "messages"

    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert _error(e)["code"] == "invalid_api_key"

    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hello", temperature=5)
    assert _error(e)["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hello", n=99)  # above max_n
    assert _error(e)["param"] == "n"

    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=MODEL, prompt="x" * 100_000, max_tokens=1)
    assert e.value.status_code == 413 and _error(e)["code"] == "request_too_large"


def test_errors_raw_http(server: BackgroundServer) -> None:
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/chat/completions", content=b'{"model": "x", "messages": [', headers=auth)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(server.url + "/v1/chat/completions", content=b"[1, 2]", headers=auth)
    assert r.status_code == 400
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi"})  # no key
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    r = httpx.get(server.url + "/v1/nothing-here", headers=auth)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.url + "/v1/chat/completions", headers=auth)
    assert r.status_code == 405 and "error" in r.json()
    r = httpx.post(
        server.url + "/v1/completions", content=b"{" + b" " * 70_000 + b"}", headers={**auth, "Content-Length": "70002"}
    )
    assert r.status_code == 413


def test_concurrency_limit_and_disconnect(llama: LLM) -> None:
    settings = ServeSettings(model_name=MODEL, max_batch=1, max_queue=0)
    with BackgroundServer(llama, settings) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        long = client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        next(iter(long))  # it holds the only row now
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
        assert e.value.status_code == 429
        long.close()  # the client goes away mid-stream: its row must be freed
        deadline = time.monotonic() + 20
        while srv.scheduler.load != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.scheduler.load == (0, 0)
        r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, extra_body={"ignore_eos": True})
        assert r.usage is not None and r.usage.completion_tokens == 2


def test_slow_reader_does_not_stall_others(llama: LLM) -> None:
    settings = ServeSettings(model_name=MODEL, max_batch=4)
    with BackgroundServer(llama, settings) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        slow = client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=200, stream=True, extra_body={"ignore_eos": True}
        )
        next(iter(slow))  # read one chunk, then stop reading
        t0 = time.perf_counter()
        r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=30, extra_body={"ignore_eos": True})
        assert r.usage is not None and r.usage.completion_tokens == 30
        assert time.perf_counter() - t0 < 30
        # The slow stream is intact: it can still be read to the end.
        rest = list(slow)
        assert rest[-1].choices[0].finish_reason == "length"


def test_non_streaming_disconnect_frees_row(llama: LLM) -> None:
    settings = ServeSettings(model_name=MODEL, max_batch=1, max_queue=0)
    with BackgroundServer(llama, settings) as srv:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2000, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + 20
        while srv.scheduler.load != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.scheduler.load == (0, 0)
