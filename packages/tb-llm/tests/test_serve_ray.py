"""Scale-out on Ray Serve (tb_llm.serve.ray): a local Ray instance on loopback, 2 replicas of a
tiny model, concurrent OpenAI-client requests, one replica killed under load (requests running on
it end with an error, none hang, the rest are served), and a clean shutdown."""

from __future__ import annotations

import concurrent.futures as cf
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray  # in tb-llm's test extra
from ray import serve

from tb_llm.serve.ray import DEPLOYMENT_NAME, app_builder, build_app

APP = "tb-llm-test"
MODEL = "tiny-llama"
pytestmark = pytest.mark.timeout(600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint(llama_dir: Path) -> Iterator[str]:
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="tb-llm-test")
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(str(llama_dir), 2, model_name=MODEL, threads=1, max_batch=4, prefix_cache_mb=0)
        serve.run(app, name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _client(endpoint: str, timeout: float = 60.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def _replicas() -> list[dict[str, Any]]:
    return [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::") and f"#{DEPLOYMENT_NAME}#" in a["name"]
    ]


def _ask(client: openai.OpenAI, i: int, tokens: int = 12) -> str:
    if i % 2:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Say hello {i}"}], max_tokens=tokens
        )
        return r.choices[0].message.content or ""
    text = ""
    for chunk in client.completions.create(model=MODEL, prompt=f"Count {i}:", max_tokens=tokens, stream=True):
        text += chunk.choices[0].text if chunk.choices else ""
    return text


def test_settings_are_checked_in_the_driver(llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown server setting"):
        build_app(str(llama_dir), 2, max_bach=4)
    with pytest.raises(ValueError, match="num_replicas"):
        build_app(str(llama_dir), 0)
    with pytest.raises(ValueError, match="model="):
        app_builder({"num_replicas": "2"})


def test_two_replicas_serve_concurrent_clients(endpoint: str) -> None:
    assert len(_replicas()) == 2
    client = _client(endpoint)
    assert [m.id for m in client.models.list().data] == [MODEL]
    with cf.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: _ask(client, i), range(32)))
    assert len(answers) == 32 and all(isinstance(a, str) for a in answers)
    assert sum(1 for a in answers if a) >= 30  # a tiny random model may emit EOS at once, rarely


def test_a_replica_killed_under_load(endpoint: str) -> None:
    """Streams running on the killed replica end with an error; none hang; the rest finish, and
    requests after the kill are served."""
    client = _client(endpoint, timeout=90)
    started = threading.Event()
    outcomes: list[str] = []
    lock = threading.Lock()

    def long_stream(i: int) -> None:
        try:
            stream = client.completions.create(
                model=MODEL, prompt=f"Story {i}:", max_tokens=1500, stream=True, extra_body={"ignore_eos": True}
            )
            n = 0
            for _chunk in stream:
                n += 1
                started.set()
            result = "ok" if n > 0 else "empty"
        except (openai.APIError, httpx.HTTPError) as exc:  # an error response, or a cut stream
            result = f"error:{type(exc).__name__}"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=long_stream, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    assert started.wait(60), "no stream produced a token"
    victim = _replicas()[0]
    ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
    deadline = time.monotonic() + 180
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"requests hung after a replica was killed: {outcomes}"
    assert len(outcomes) == 8
    assert outcomes.count("ok") >= 1, outcomes  # the surviving replica's streams completed
    assert any(o.startswith("error:") for o in outcomes), f"the kill hit no stream in flight: {outcomes}"
    # after the kill, new requests are served (by the survivor, then also by Ray's replacement)
    fresh = _client(endpoint)
    served = [_ask(fresh, i, tokens=4) for i in range(6)]
    assert len(served) == 6
