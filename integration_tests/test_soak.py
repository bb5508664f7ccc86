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
