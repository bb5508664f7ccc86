"""Speculative decoding (prompt lookup) in the server: the ``speculative`` request extension and
``--speculative`` default give the plain greedy output, the metrics count drafts, and a request
speculates only while it is alone in the batch."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tb_llm import LLM
from tb_llm.serve import ServeSettings
from tb_llm.serve.app import OpenAIServer
from tb_llm.serve.row_sampler import RequestSampling
from tb_llm.serve.scheduler import Event, Finished, Job, Scheduler
from tb_llm.speculative import Speculative

MODEL = "tiny"
REPEATING = "one two three four one two three four one two three four one two"


def _counter(text: str, name: str) -> float:
    m = re.search(rf"^tb_llm_{name} (\S+)$", text, re.M)
    assert m, f"no {name} in /metrics"
    return float(m.group(1))


def _server(llm: LLM, **settings: Any) -> Iterator[TestClient]:
    server = OpenAIServer(llm, ServeSettings(model_name=MODEL, max_model_len=512, **settings))
    with TestClient(server.app) as client:
        yield client


@pytest.fixture(scope="module")
def plain(llama: LLM) -> Iterator[TestClient]:
    yield from _server(llama)


@pytest.fixture(scope="module")
def spec_default(llama: LLM) -> Iterator[TestClient]:
    yield from _server(llama, speculative="ngram", draft_tokens=5)


def _spec_counts(client: TestClient) -> tuple[float, float, float]:
    text = client.get("/metrics").text
    return tuple(  # type: ignore[return-value]
        _counter(text, f"speculative_{n}_total") for n in ("steps", "draft_tokens", "accepted_tokens")
    )


def _complete(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/completions", json={"model": MODEL, "max_tokens": 40, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_request_extension_greedy_equals_plain(llama: LLM, plain: TestClient) -> None:
    want = llama.generate(REPEATING, max_new_tokens=40)
    assert not isinstance(want, list)
    base = _complete(plain, prompt=REPEATING)
    steps0, proposed0, accepted0 = _spec_counts(plain)
    assert steps0 == proposed0 == accepted0 == 0  # nothing speculates unless asked
    for spec in ("ngram", {"method": "ngram", "num_tokens": 3}, {"num_tokens": 8, "ngram": 2, "min_ngram": 1}):
        fast = _complete(plain, prompt=REPEATING, speculative=spec)
        assert fast["choices"][0]["text"] == base["choices"][0]["text"] == want.text
        assert fast["choices"][0]["finish_reason"] == base["choices"][0]["finish_reason"]
        assert fast["usage"] == base["usage"]
    steps, proposed, accepted = _spec_counts(plain)
    assert steps > 0 and proposed >= accepted > 0, "no draft accepted: the verify path was not exercised"
    # fewer model steps than tokens: each accepted draft saved one
    assert accepted >= 3


def test_server_default_speculates_and_a_request_can_turn_it_off(plain: TestClient, spec_default: TestClient) -> None:
    messages = [{"role": "user", "content": REPEATING}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0}
    want = plain.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    before = _spec_counts(spec_default)
    got = spec_default.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    assert got == want
    mid = _spec_counts(spec_default)
    assert mid[0] > before[0] and mid[1] > before[1]
    off = spec_default.post("/v1/chat/completions", json={**body, "speculative": None}).json()
    assert off["choices"][0]["message"]["content"] == want
    assert _spec_counts(spec_default) == mid  # speculative: null -> plain steps only
    # streamed: the same text, deltas joined
    with spec_default.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(json.loads(x)["choices"][0]["delta"].get("content") or "" for x in lines)
    assert text == want


def test_logprobs_and_stop_with_speculation(plain: TestClient) -> None:
    base = _complete(plain, prompt=REPEATING, logprobs=2, stop=["four one"])
    fast = _complete(plain, prompt=REPEATING, logprobs=2, stop=["four one"], speculative="ngram")
    a, b = base["choices"][0], fast["choices"][0]
    assert b["text"] == a["text"] and b["finish_reason"] == a["finish_reason"]
    assert b["logprobs"]["tokens"] == a["logprobs"]["tokens"]
    for x, y in zip(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]):
        assert y == pytest.approx(x, abs=1e-3)  # a verify step's matmul rounds a little differently


def test_sampled_requests_are_seeded_and_complete(plain: TestClient) -> None:
    body = {"prompt": REPEATING, "temperature": 0.7, "top_k": 20, "seed": 5, "speculative": "ngram"}
    one, two = _complete(plain, **body), _complete(plain, **body)
    assert one["choices"][0]["text"] == two["choices"][0]["text"]  # same seed, same sample
    assert one["usage"]["completion_tokens"] <= 40


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"speculative": "draft"}, "speculative.method", "prompt lookup"),
        ({"speculative": {"method": "medusa"}}, "speculative.method", "must be 'ngram'"),
        ({"speculative": {"num_tokens": 0}}, "speculative", "num_tokens"),
        ({"speculative": {"lookahead": 2}}, "speculative", "unknown 'speculative' field"),
        ({"speculative": 3}, "speculative", "must be 'ngram', an object, or null"),
        ({"speculative": "ngram", "logit_bias": {"5": 2}}, "speculative", "cannot be combined with 'logit_bias'"),
        ({"speculative": "ngram", "frequency_penalty": 0.5}, "speculative", "frequency_penalty"),
    ],
)
def test_bad_speculative_requests_are_400(plain: TestClient, extra: dict[str, Any], param: str, message: str) -> None:
    r = plain.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4, **extra})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"]


def test_default_with_logit_bias_decodes_plainly(plain: TestClient, spec_default: TestClient) -> None:
    body = {"prompt": REPEATING, "logit_bias": {"7": 1.5}}
    want = _complete(plain, **body)["choices"][0]["text"]
    before = _spec_counts(spec_default)
    assert _complete(spec_default, **body)["choices"][0]["text"] == want
    assert _spec_counts(spec_default) == before


def test_speculation_waits_until_the_job_is_alone(llama: LLM) -> None:
    """Two speculative jobs share the batch: plain batched steps; once one is done, the other
    speculates. Both texts are the plain greedy ones."""
    sched = Scheduler(llama, max_batch=4)
    events: list[list[Event]] = [[], []]
    spec = Speculative("ngram", num_tokens=4)
    prompts = [llama.encode(REPEATING), llama.encode("two three four one two three four one two three")]
    jobs = [
        Job(p, n, RequestSampling(temperature=0.0), [], True, events[i].append, speculative=spec)
        for i, (p, n) in enumerate(zip(prompts, (6, 30)))
    ]
    for job in jobs:
        sched._prefill(job)
    while not jobs[0].done:
        sched._decode()
        assert sched.metrics.spec_steps.value() == 0  # two live rows: no verify steps
        sched._drop_finished()
    while not jobs[1].done:
        sched._decode()
        sched._drop_finished()
    assert sched.metrics.spec_steps.value() > 0 and sched.metrics.spec_accepted.value() > 0
    for i, job in enumerate(jobs):
        want = llama.generate(prompts[i], max_new_tokens=job.max_tokens, ignore_eos=True)
        assert not isinstance(want, list)
        done = [e for e in events[i] if isinstance(e, Finished)]
        assert len(done) == 1 and list(done[0].token_ids) == want.token_ids


def test_serve_cli_speculative_options(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tb_llm.serve import cli as serve_cli
    from tb_llm.serve import http_server

    seen: dict[str, ServeSettings] = {}
    monkeypatch.setattr(http_server, "serve", lambda llm, settings, *rest: seen.update(settings=settings))
    parser = argparse.ArgumentParser()
    serve_cli.add_serve_parser(parser.add_subparsers())
    base = ["serve", "--model", str(llama_dir), "--device", "cpu"]
    assert serve_cli.run_serve(parser.parse_args(base)) == 0
    assert seen["settings"].speculative is None and seen["settings"].draft_tokens == 4
    assert serve_cli.run_serve(parser.parse_args([*base, "--speculative", "ngram", "--draft-tokens", "6"])) == 0
    assert seen["settings"].speculative == "ngram" and seen["settings"].draft_tokens == 6
    assert serve_cli.run_serve(parser.parse_args([*base, "--draft-tokens", "0"])) == 2
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--speculative", "medusa"])
