"""The kernels' thread pool: PyTorch's OpenMP team (default where torch uses libgomp) and rayon
give the same results as eager PyTorch, across the parallel paths of every kernel family."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tb_cpu_rust import _native
from tb_cpu_rust.threads import use_torch_openmp
from torchburn.testing.conformance import compile_with, native_and_fallback

POOLS = ["rayon", "openmp"] if use_torch_openmp() == "openmp" else ["rayon"]


@pytest.fixture(params=POOLS)
def pool(request: pytest.FixtureRequest) -> Iterator[str]:
    before, threads = _native.thread_pool(), torch.get_num_threads()
    _native.set_thread_pool(request.param)
    torch.set_num_threads(2)
    yield request.param
    _native.set_thread_pool(before)
    torch.set_num_threads(threads)


def _check(fn: Callable[..., Any], *args: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    compiled, reports = compile_with("native_cpu", fn, cache=False)
    with torch.no_grad():
        got = compiled(*args)
        want = fn(*args)
    assert not native_and_fallback(reports)[1]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torch's libgomp is looked up in /proc/self/maps")
def test_linux_torch_uses_its_openmp_team() -> None:
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch is not built with OpenMP")
    assert use_torch_openmp() == "openmp"
    assert _native.num_threads() == torch.get_num_threads()


def test_unknown_pool_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown thread pool"):
        _native.set_thread_pool("tbb")


@pytest.mark.parametrize(
    "shape",
    [
        (7, 9, 5),
        (64, 512, 784),
        (96, 1024, 512),
        (257, 300, 200),
        (300, 64, 512),
        (512, 784, 64),
        (1000, 33, 70),
        (200, 40, 5000),
    ],
)
@pytest.mark.parametrize("transposed_b", [False, True])
def test_gemm_paths_match_torch(pool: str, shape: tuple[int, int, int], transposed_b: bool) -> None:
    m, n, k = shape
    g = torch.Generator().manual_seed(m * n + k)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(n, k, generator=g).t() if transposed_b else torch.randn(k, n, generator=g)
    bias = torch.randn(n, generator=g)
    _check(lambda a, b, bias: torch.relu(torch.addmm(bias, a, b)), a, b, bias, rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("shape", [(3, 5), (256, 300), (2048, 129), (17, 70000)])
def test_elementwise_and_softmax_paths_match_torch(pool: str, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(shape[0])
    x, w = torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g)
    _check(lambda x, w: F.gelu(x * w + 1.0) * torch.sigmoid(x) + x, x, w)
    _check(F.gelu, x)
    _check(lambda x: torch.softmax(x, -1), x)
    _check(lambda x: torch.log_softmax(x.t(), 0), x)
    _check(lambda x: x.sum(0), x)


def test_conv_pool_and_attention_match_torch(pool: str) -> None:
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(4, 8, 20, 20, generator=g), torch.randn(16, 8, 3, 3, generator=g)
    _check(lambda x, w: F.max_pool2d(torch.relu(F.conv2d(x, w, padding=1)), 2), x, w, atol=1e-3)
    _check(lambda x: F.adaptive_avg_pool2d(x, 3), x)
    q, k, v = (torch.randn(2, 4, 130, 32, generator=g) for _ in range(3))
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, atol=1e-4)


def test_calls_from_several_python_threads(pool: str) -> None:
    # each calling thread gets its own OpenMP team; results must not mix
    compiled, _ = compile_with("native_cpu", lambda a, b: torch.relu(a @ b) * 2.0, cache=False)
    g = torch.Generator().manual_seed(5)
    pairs = [(torch.randn(200, 300, generator=g), torch.randn(300, 150, generator=g)) for _ in range(4)]
    results: list[Any] = [None] * len(pairs)
    with torch.no_grad():
        compiled(*pairs[0])

        def work(i: int) -> None:
            with torch.no_grad():
                for _ in range(5):
                    results[i] = compiled(*pairs[i])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(pairs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for (a, b), got in zip(pairs, results):
        torch.testing.assert_close(got, torch.relu(a @ b) * 2.0, rtol=1e-4, atol=2e-3)


def test_training_step_matches_eager(pool: str) -> None:
    # native calls alternate with eager OpenMP ops (loss, Adam) in one step
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(50, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    model = torch.nn.Sequential(torch.nn.Linear(50, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    model.load_state_dict(ref.state_dict())
    compiled, _ = compile_with("native_cpu", model, cache=False)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (ref, model)]
    x, y = torch.randn(40, 50), torch.randint(0, 5, (40,))
    for _ in range(3):
        for f, opt in ((ref, opts[0]), (compiled, opts[1])):
            opt.zero_grad()
            F.cross_entropy(f(x), y).backward()
            opt.step()
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
