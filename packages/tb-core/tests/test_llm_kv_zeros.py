"""``torchburn.llm.kv_cache.zeros`` (calloc'd, no parallel fill on the CPU) and the KV cache built on it."""

from __future__ import annotations

import pytest
import torch

from torchburn.llm.kv_cache import KVCache, zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(1, 3, 257, 64), (2, 5), (7,), (0, 4), (3, 0, 2), ()])
def test_zeros_is_torch_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    got = zeros(shape, dtype, "cpu")
    torch.testing.assert_close(got, torch.zeros(shape, dtype=dtype), rtol=0, atol=0)
    assert got.shape == shape and got.dtype == dtype and got.is_contiguous()


def test_zeros_are_writable_and_independent() -> None:
    a, b = zeros((4, 4), torch.float32, torch.device("cpu")), zeros((4, 4), torch.float32, "cpu")
    a[1, 2] = 5.0
    with torch.inference_mode():
        a[0, 0] = 1.0
    assert float(a.sum()) == 6.0 and float(b.abs().sum()) == 0.0  # separate memory
    assert a.data_ptr() != b.data_ptr()


def test_kv_cache_buffers_start_zeroed_and_keep_their_contents_when_grown() -> None:
    cache = KVCache(2, 1, 2, 8, 4, torch.float32, torch.device("cpu"))
    for layer in range(2):
        assert float(cache.keys(layer).abs().sum()) == 0.0 and cache.keys(layer).shape == (1, 2, 4, 8)
    cache.begin(torch.arange(3)[None])
    k = torch.randn(1, 2, 3, 8)
    cache.write(0, k, -k)
    cache.commit(3)
    cache.reserve(40)  # a new generation of buffers
    assert cache.capacity >= 40
    torch.testing.assert_close(cache.keys(0)[:, :, :3], k)
    torch.testing.assert_close(cache.values(0)[:, :, :3], -k)
    assert float(cache.keys(0)[:, :, 3:].abs().sum()) == 0.0
    assert cache.pos[0, :3].tolist() == [0, 1, 2] and (cache.pos[0, 3:] == -1).all()
