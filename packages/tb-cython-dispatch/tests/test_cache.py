"""Dispatch cache: hits skip resolution, mismatches resolve anew, nothing stale is reused."""

from __future__ import annotations

import pytest
import torch

import turbo_torch
from tb_cython_dispatch import resolve
from turbo_torch import nn


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _reference(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.Module.__call__(m, x)  # torch's own generic path, every child too


def _eager(m: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    for child in m:
        x = torch.nn.Module.__call__(child, x)
    return x


def test_hit_after_warmup(impl) -> None:  # type: ignore[no-untyped-def]
    m = _mlp()
    x = torch.randn(3, 8)
    for _ in range(5):
        assert torch.equal(m(x), _eager(m, x))
    info = turbo_torch.cache_info()["nn.Sequential"]
    assert info == {"hits": 4, "misses": 1, "entries": 1, "invalidations": 0, "native": 0}


def test_hit_skips_resolution(impl, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls = []
    real = resolve.resolve_sequential

    def counting(seq, key):  # type: ignore[no-untyped-def]
        calls.append(key)
        return real(seq, key)

    impl.set_resolvers(resolve.resolve_type, counting)
    try:
        m = _mlp()
        x = torch.randn(2, 8)
        for _ in range(4):
            m(x)
        assert len(calls) == 1
    finally:
        impl.set_resolvers(resolve.resolve_type, resolve.resolve_sequential)


@pytest.mark.parametrize(
    "change",
    ["shape", "dtype", "stride", "requires_grad", "no_grad", "inference_mode", "rank"],
)
def test_signature_change_is_a_miss_with_correct_result(impl, change: str) -> None:  # type: ignore[no-untyped-def]
    m = _mlp()
    x = torch.randn(4, 8)
    m(x)
    m(x)
    ctx = torch.enable_grad()
    if change == "shape":
        y = torch.randn(7, 8)
    elif change == "dtype":
        m = m.double()  # parameters change dtype too; the plan reads them live
        y = x.double()
    elif change == "stride":
        y = torch.randn(8, 4).t()
    elif change == "requires_grad":
        y = x.clone().requires_grad_()
    elif change == "no_grad":
        y, ctx = x, torch.no_grad()
    elif change == "inference_mode":
        y, ctx = x, torch.inference_mode()
    else:
        y = torch.randn(2, 3, 8)
    with ctx:
        got = m(y)
        want = _eager(m, y)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
    info = turbo_torch.cache_info()["nn.Sequential"]
    assert info["misses"] == 2 and info["entries"] == 2, info
    # and the first signature is still a hit
    with ctx:
        m(x if change != "dtype" else x.double())


def test_structure_change_invalidates(impl) -> None:  # type: ignore[no-untyped-def]
    m = _mlp()
    x = torch.randn(3, 8)
    m(x)
    m[1] = nn.Tanh()
    assert torch.equal(m(x), torch.tanh(m[0](x)) @ m[2].weight.t() + m[2].bias)
    info = turbo_torch.cache_info()["nn.Sequential"]
    assert info["invalidations"] == 1 and info["entries"] == 1
    m.append(nn.Sigmoid())
    assert torch.equal(m(x), _eager(m, x))
    assert turbo_torch.cache_info()["nn.Sequential"]["invalidations"] == 2


def test_parameter_replacement_is_seen(impl) -> None:  # type: ignore[no-untyped-def]
    m = _mlp()
    x = torch.randn(3, 8)
    m(x)
    m[0].weight = torch.nn.Parameter(torch.zeros(16, 8))
    with torch.no_grad():
        m[2].bias.fill_(3.0)
    assert torch.equal(m(x), _eager(m, x))


def test_clear_cache(impl) -> None:  # type: ignore[no-untyped-def]
    m = _mlp()
    x = torch.randn(3, 8)
    m(x)
    m(x)
    turbo_torch.clear_cache()
    assert turbo_torch.cache_info() == {}
    m(x)
    assert turbo_torch.cache_info()["nn.Sequential"] == {
        "hits": 0,
        "misses": 1,
        "entries": 1,
        "invalidations": 0,
        "native": 0,
    }


def test_many_signatures_evict(impl) -> None:  # type: ignore[no-untyped-def]
    m = _mlp()
    for n in range(1, 12):
        m(torch.randn(n, 8))
    info = turbo_torch.cache_info()["nn.Sequential"]
    assert info["entries"] == impl.CACHE.max_entries_per_site
    assert info["invalidations"] == 11 - impl.CACHE.max_entries_per_site


def test_cache_disabled_uses_torch_call(impl, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    turbo_torch.set_cache_enabled(False)
    try:
        m = _mlp()
        x = torch.randn(3, 8)
        assert torch.equal(m(x), _eager(m, x))
        assert "nn.Sequential" not in turbo_torch.cache_info()
    finally:
        turbo_torch.set_cache_enabled(True)


def test_env_var_turns_cache_off() -> None:
    import subprocess
    import sys

    code = "import turbo_torch; print(turbo_torch.cache_enabled())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "TORCHBURN_DISPATCH_CACHE": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_key_is_cheap_and_complete(impl) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(2, 3)
    k = impl.call_key(x)
    assert k == impl.call_key(torch.randn(2, 3))
    assert k != impl.call_key(torch.randn(2, 3, dtype=torch.float64))
    assert k != impl.call_key(torch.randn(3, 2).t())
    assert k != impl.call_key(torch.randn(2, 3).requires_grad_())
    with torch.no_grad():
        assert k != impl.call_key(x)
    assert impl.call_key(torch.nn.Parameter(x)) is None  # subclasses take the generic path
    assert impl.call_key(3) is None
