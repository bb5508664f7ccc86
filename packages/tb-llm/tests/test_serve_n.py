"""n > 1 with seed through the real ``openai`` client: choice i is the n=1 request with seed + i."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from tb_llm import LLM  # noqa: E402
from tb_llm.serve import BackgroundServer, ServeSettings  # noqa: E402

MODEL = "tiny-llama"
KW = dict(model=MODEL, max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def client(llama: LLM) -> Iterator[openai.OpenAI]:
    with BackgroundServer(llama, ServeSettings(model_name=MODEL, max_batch=4, max_queue=4, max_n=6)) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_n_choices_are_reproducible_per_choice(llama: LLM, client: openai.OpenAI) -> None:
    r = client.completions.create(prompt="Hello", n=3, seed=21, **KW)  # type: ignore[arg-type]
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.text for c in r.choices]
    again = client.completions.create(prompt="Hello", n=3, seed=21, **KW)  # type: ignore[arg-type]
    assert [c.text for c in again.choices] == texts
    for i, text in enumerate(texts):
        one = client.completions.create(prompt="Hello", seed=21 + i, **KW)  # type: ignore[arg-type]
        assert one.choices[0].text == text
    want = llama.generate("Hello", n=3, seed=21, max_new_tokens=8, temperature=1.0, ignore_eos=True)
    assert isinstance(want, list) and [g.text for g in want] == texts
    assert len(set(texts)) > 1
    assert r.usage is not None and r.usage.prompt_tokens == len(llama.encode("Hello"))
    assert r.usage.completion_tokens == 3 * 8


def test_chat_n_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me"}]
    whole = client.chat.completions.create(messages=messages, n=4, seed=3, **KW)  # type: ignore[call-overload]
    parts = ["", "", "", ""]
    finish: dict[int, str] = {}
    roles = set()
    for chunk in client.chat.completions.create(messages=messages, n=4, seed=3, stream=True, **KW):  # type: ignore[call-overload]
        for c in chunk.choices:
            parts[c.index] += c.delta.content or ""
            if c.delta.role:
                roles.add(c.index)
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert parts == [c.message.content for c in whole.choices]
    assert roles == {0, 1, 2, 3} and finish == {i: "length" for i in range(4)}


def test_n_limits(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt="Hello", n=7, **KW)  # type: ignore[arg-type]
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt="Hello", n=0, **KW)  # type: ignore[arg-type]
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt="Hello", n=2, best_of=3, **KW)  # type: ignore[arg-type]
    assert e.value.body["param"] == "best_of"
    # 6 choices fit in 4 rows + 4 queue places; all come back.
    r = client.completions.create(prompt="Hello", n=6, seed=0, **KW)  # type: ignore[arg-type]
    assert len(r.choices) == 6
