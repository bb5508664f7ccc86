"""The compiled extension is really what runs in CI."""

from __future__ import annotations

import pytest

import tb_cython_dispatch
from tb_cython_dispatch import _fallback, _impl


def test_compiled_extension_imported() -> None:
    assert _impl.COMPILED_AVAILABLE, f"tb_cython_dispatch._dispatch did not import: {_impl.COMPILED_IMPORT_ERROR}"
    from tb_cython_dispatch import _dispatch

    assert _dispatch.__file__.endswith((".so", ".pyd")), _dispatch.__file__
    assert _dispatch.IMPLEMENTATION == "compiled"
    assert tb_cython_dispatch.implementation() == "compiled"


def test_fixture_switches_implementation(impl) -> None:  # type: ignore[no-untyped-def]
    assert tb_cython_dispatch.implementation() == impl.IMPLEMENTATION
    assert _impl.core is impl


def test_both_implementations_have_the_same_api() -> None:
    from tb_cython_dispatch import _dispatch

    public = {
        n
        for n in dir(_fallback)
        if (not n.startswith("_") and n[0].islower())
        or n in ("CACHE", "Site", "PlanRunner", "DispatchCache", "OpStats")
    }
    public -= {"annotations", "torch", "Any", "Callable"}
    missing = sorted(n for n in public if not hasattr(_dispatch, n))
    assert not missing


def test_unknown_implementation_is_refused() -> None:
    with pytest.raises(ValueError, match="compiled' or 'python"):
        tb_cython_dispatch.set_implementation("rust")
