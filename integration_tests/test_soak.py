"""Soak: many calls keep resident memory flat; the in-memory cache stays within its limit."""

from __future__ import annotations

import resource

import pytest
import torch
from conftest import ENGINES

import torchburn
from torchburn.cache import configure
from torchburn.testing.models import readme_mlp


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


@pytest.mark.parametrize("engine", ENGINES)
def test_ten_thousand_calls_keep_memory_flat(engine: str) -> None:
    model, (x,) = readme_mlp(batch=4)
    x = x[:4]
    compiled = torch.compile(model, backend="torchburn", options={"engine": engine})
    samples = []
    with torch.no_grad():
        for i in range(10_000):
            compiled(x)
            if i % 1000 == 999:
                samples.append(rss_mb())
    # slope over the last 8 samples, in MB per 1000 calls
    tail = samples[2:]
    slope = (tail[-1] - tail[0]) / (len(tail) - 1)
    print(f"{engine}: RSS {samples[0]:.1f} -> {samples[-1]:.1f} MB, slope {slope:.3f} MB/1000 calls")
    assert slope < 0.5, f"resident memory grows {slope:.2f} MB per 1000 calls: {samples}"


def test_eviction_keeps_cache_within_limit() -> None:
    if not ENGINES:
        pytest.skip("no engine installed")
    cache = configure(maxsize=4)
    try:
        for width in range(4, 16):
            m = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
            torch._dynamo.reset()
            with torch.no_grad():
                torch.compile(m, backend="torchburn", options={"engine": ENGINES[0]})(torch.randn(2, width))
            assert len(cache) <= 4
        assert torchburn.cache_info()["evictions"] > 0
    finally:
        configure(maxsize=512)


def _llm_engines() -> list[str | None]:
    """The PyTorch reference path plus every installed engine that offers tb-llm a backend."""
    try:
        from torchburn.llm_backend import llm_backends
    except ImportError:
        return [None]
    return [None, *sorted({b.engine for b in llm_backends()})]


@pytest.mark.parametrize("llm_engine", _llm_engines(), ids=lambda e: e or "reference")
def test_two_thousand_generated_tokens_keep_memory_flat(llm_engine: str | None, tmp_path_factory) -> None:
    tb_llm = pytest.importorskip("tb_llm", reason="tb-llm is not installed")
    pytest.importorskip("transformers", reason="the tiny checkpoint is built with transformers")
    from tb_llm.testing import make_checkpoint

    folder = make_checkpoint("llama", tmp_path_factory.mktemp("soak") / "model")
    llm = tb_llm.LLM.from_pretrained(folder, device="cpu", engine=llm_engine)
    llm.generate("warm up", max_new_tokens=64, ignore_eos=True)  # allocator and kernels reach steady state
    # (deltas streamed so far, RSS MB): a delta is one token, or several merged into whole UTF-8 characters
    samples: list[tuple[int, float]] = []
    result: list = []
    stream = llm.stream("def main():", max_new_tokens=2000, temperature=0.8, seed=0, ignore_eos=True, result=result)
    for deltas, _ in enumerate(stream, 1):
        if deltas % 100 == 0:
            samples.append((deltas, rss_mb()))
    generated = len(result[0].token_ids)
    assert generated == 2000, f"stopped after {generated} tokens ({result[0].finish_reason})"
    tail = samples[len(samples) // 4 :]  # after warm-up
    (d0, m0), (d1, m1) = tail[0], tail[-1]
    per_1000_tokens = (m1 - m0) / (d1 - d0) * 1000 * deltas / generated
    print(
        f"llm {llm_engine or 'reference'}: RSS {samples[0][1]:.1f} -> {samples[-1][1]:.1f} MB over {generated} "
        f"tokens, slope {per_1000_tokens:.3f} MB/1000 tokens"
    )
    assert per_1000_tokens < 1.0, f"resident memory grows {per_1000_tokens:.2f} MB per 1000 tokens: {samples}"
