"""turbo_torch.sin / cos / tanh on native_cpu's eager kernels, through tb-core's interop.

tb-cython-dispatch's own tests run the dispatch paths against a fake engine; here the kernels are
native_cpu's (``NativeCpuEngine.eager_kernel``), on both implementations, against PyTorch.
"""

from __future__ import annotations

import math
from types import ModuleType

import pytest
import torch

import turbo_torch
from tb_cython_dispatch import native, native_unary

OPS = native_unary.OPS
CALLS = native.HOT_AFTER + 2 * (native.WARMUP + native.SAMPLES) + 2
SHAPES = [(), (0,), (1,), (7,), (9,), (64, 64), (3, 0, 5), (513, 130), (300, 300)]


def _values(shape: tuple[int, ...]) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 4
    flat = x.view(-1)
    specials = [
        0.0, -0.0, math.nan, math.inf, -math.inf, 1e-30, -1e-30, 1e-8, 20.0, -20.0, 88.0, -88.0,
        math.pi / 2, math.pi, 1e4, -1e4, 65536.0, 1e5, -3e7, 3.4e38, -3.4e38, 1.17e-38,
    ]  # fmt: skip
    k = min(len(specials), flat.numel())
    flat[:k] = torch.tensor(specials[:k])
    return x


def test_the_kernels_are_native_cpus(cython_native: ModuleType) -> None:
    kernels = native_unary.kernels()
    assert sorted(kernels) == sorted(OPS)
    assert all(fn.__name__.startswith("native_cpu_") for fn in kernels.values())


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_native_matches_torch(cython_native: ModuleType, op: str, shape: tuple[int, ...]) -> None:
    x = _values(shape)
    want = getattr(torch, op)(x)
    fn = getattr(turbo_torch, op)
    with torch.no_grad():
        outs = [fn(x) for _ in range(CALLS)]
    from turbo_torch import _unary

    nat = _unary._cells[op][1].lookup(None, x.numel())[0]
    assert nat is not None and nat.state == native.NATIVE
    for out in outs:
        assert out.shape == want.shape and out.stride() == want.stride()
        torch.testing.assert_close(out, want, equal_nan=True)
    if x.numel() > 1:  # signed zeros as PyTorch: sin(-0) = -0, tanh(-0) = -0, cos(-0) = 1
        assert torch.equal(torch.signbit(outs[-1].view(-1)[:2]), torch.signbit(want.view(-1)[:2]))
    assert turbo_torch.cache_info()[f"torch.{op}"]["native"] == 1


def test_real_timing_decides(cython_native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the real timed decision (the fixture's fixed one was set on this monkeypatch)
    native.set_native_enabled(True)
    x = torch.randn(64, 64)
    with torch.no_grad():
        for _ in range(CALLS):
            turbo_torch.tanh(x)
    from turbo_torch import _unary

    assert _unary._cells["tanh"][1].lookup(None, x.numel())[0].state in (native.NATIVE, native.TORCH)
