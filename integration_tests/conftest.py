from __future__ import annotations

import warnings
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

import torchburn
from torchburn import plugins


def installed_engines() -> list[str]:
    plugins.reload()
    return sorted(name for name, engine in plugins.engines().items() if engine.is_available() and name != "example")


ENGINES = installed_engines()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    torch._dynamo.reset()
    torchburn.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchburn.TorchburnFallbackWarning)
        yield


@pytest.fixture(params=["compiled", "python"])
def cython_native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """tb-cython-dispatch on each implementation, its cache fresh, every native entry decided native
    (the cython_dispatch + native_cpu tests)."""
    import tb_cython_dispatch
    from tb_cython_dispatch import native

    previous, enabled = tb_cython_dispatch.implementation(), native.native_enabled()
    module = tb_cython_dispatch.set_implementation(request.param)
    module.CACHE.enabled = True
    module.CACHE.clear()
    plugins.reload()
    native.reset_for_tests()
    native.set_native_enabled(True)
    monkeypatch.setattr(native, "decide", lambda native_ns, torch_ns: native.NATIVE)
    try:
        yield module
    finally:
        native.set_native_enabled(enabled)
        native.reset_for_tests()
        tb_cython_dispatch.set_implementation(previous)
