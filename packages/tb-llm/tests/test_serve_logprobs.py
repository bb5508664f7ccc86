"""logprobs / top_logprobs / echo through the real ``openai`` client, against LLM.generate and LLM.score
(themselves checked against transformers' log_softmax in test_logprobs.py / test_score.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from tb_llm import LLM  # noqa: E402
from tb_llm.serve import BackgroundServer, ServeSettings  # noqa: E402

MODEL = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Grüße aus München"}]


@pytest.fixture(scope="module")
def server(llama: LLM) -> Iterator[BackgroundServer]:
    with BackgroundServer(llama, ServeSettings(model_name=MODEL, max_batch=4, max_model_len=256)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _gen(llm: LLM, prompt: object, **kw: object):  # type: ignore[no-untyped-def]
    g = llm.generate(prompt, **kw)  # type: ignore[arg-type]
    assert not isinstance(g, list) and g.logprobs is not None
    return g


def test_chat_logprobs_equal_generate(llama: LLM, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=3,  # type: ignore[arg-type]
    )
    want = _gen(llama, MESSAGES, max_new_tokens=12, logprobs=3)
    content = r.choices[0].logprobs.content
    # The EOS token is not part of the message, so it has no entry.
    entries = [e for e, t in zip(want.logprobs, want.token_ids) if t not in llama.eos_token_ids]
    assert [c.token for c in content] == [e.token for e in entries]
    for c, e in zip(content, entries):
        assert c.logprob == pytest.approx(e.logprob, abs=1e-4)
        assert c.bytes == list(e.token_bytes)
        assert [t.token for t in c.top_logprobs] == [t.token for t in e.top]
        assert [t.logprob for t in c.top_logprobs] == pytest.approx([t.logprob for t in e.top], abs=1e-4)


def test_chat_logprobs_without_top_and_default_off(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, logprobs=True, seed=1)  # type: ignore[arg-type]
    assert r.choices[0].logprobs is not None and all(c.top_logprobs == [] for c in r.choices[0].logprobs.content)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert r.choices[0].logprobs is None


def test_chat_stream_logprobs_equal_non_stream(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    streamed: list = []  # type: ignore[type-arg]
    text = ""
    for chunk in client.chat.completions.create(stream=True, **kw):  # type: ignore[call-overload]
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                streamed += choice.logprobs.content or []
    assert text == whole.choices[0].message.content
    assert [(c.token, round(c.logprob, 4)) for c in streamed] == [
        (c.token, round(c.logprob, 4)) for c in whole.choices[0].logprobs.content
    ]


def test_completion_logprobs_legacy_shape(llama: LLM, client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0, logprobs=2)
    want = _gen(llama, "The quick brown fox", max_new_tokens=8, logprobs=2)
    lp = r.choices[0].logprobs
    entries = [e for e, t in zip(want.logprobs, want.token_ids) if t not in llama.eos_token_ids]
    assert lp.tokens == [e.token for e in entries]
    assert lp.token_logprobs == pytest.approx([e.logprob for e in entries], abs=1e-4)
    for top, e in zip(lp.top_logprobs, entries):
        assert top == pytest.approx({t.token: t.logprob for t in e.top}, abs=1e-4)
    offsets = [0]
    for t in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp.text_offset == offsets


def test_echo_scores_the_prompt(llama: LLM, client: openai.OpenAI) -> None:
    prompt = "The quick brown fox jumps over the lazy dog"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    assert r.choices[0].text == prompt and r.usage is not None and r.usage.completion_tokens == 0
    lp = r.choices[0].logprobs
    score = llama.score(prompt)
    assert len(lp.tokens) == len(score.token_ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(score.logprobs[1:], abs=1e-4)
    # echo + generation: the prompt, then the completion, with both sets of log-probs.
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, echo=True, logprobs=0, temperature=0)
    want = _gen(llama, prompt, max_new_tokens=5, logprobs=0)
    assert r.choices[0].text == prompt + want.text
    assert r.choices[0].logprobs.token_logprobs[1:] == pytest.approx(
        score.logprobs[1:] + [e.logprob for e in want.logprobs if e.token_id not in llama.eos_token_ids], abs=1e-4
    )
    # echo without logprobs just prepends the prompt.
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True, temperature=0)
    assert r.choices[0].text.startswith(prompt) and r.choices[0].logprobs is None


def test_completion_stream_echo_and_logprobs(llama: LLM, client: openai.OpenAI) -> None:
    prompt = "def main():"
    text, tokens, values = "", [], []
    for chunk in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, echo=True, logprobs=1, temperature=0, stream=True
    ):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                values += choice.logprobs.token_logprobs
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, echo=True, logprobs=1, temperature=0)
    assert text == whole.choices[0].text
    assert tokens == whole.choices[0].logprobs.tokens
    assert values[0] is None and values[1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:], abs=1e-5)


def test_logprobs_errors(server: BackgroundServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, top_logprobs=2)  # type: ignore[arg-type]
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=21)  # type: ignore[arg-type]
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hi", logprobs=30)
    assert e.value.body["param"] == "logprobs"
    # max_tokens 0 only with echo.
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
