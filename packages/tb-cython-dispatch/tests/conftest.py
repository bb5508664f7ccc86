"""Every test that takes ``impl`` runs twice: on the Cython extension and on the fallback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType

import pytest

import tb_cython_dispatch
from tb_cython_dispatch import _impl, native

IMPLS = ["compiled", "python"]


def pytest_report_header() -> str:
    return f"tb_cython_dispatch: compiled extension available={_impl.COMPILED_AVAILABLE} ({_impl.COMPILED_IMPORT_ERROR or 'ok'})"


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    if (
        request.param == "compiled"
        and not _impl.COMPILED_AVAILABLE
        and os.environ.get("TORCHBURN_ALLOW_NO_EXTENSION") == "1"
    ):
        pytest.skip("compiled extension not built (TORCHBURN_ALLOW_NO_EXTENSION=1)")
    previous = tb_cython_dispatch.implementation()
    module = tb_cython_dispatch.set_implementation(request.param)
    module.CACHE.enabled = True
    module.CACHE.clear()
    try:
        yield module
    finally:
        tb_cython_dispatch.set_implementation(previous)


@pytest.fixture(autouse=True)
def _native_off(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite checks bit-identity with PyTorch, so the (timed, reassociating) native decision is
    off unless a test asks for it with the ``native_on`` fixture (tests/test_native.py)."""
    previous = native.native_enabled()
    native.set_native_enabled("native_on" in request.fixturenames)
    try:
        yield
    finally:
        native.set_native_enabled(previous)
