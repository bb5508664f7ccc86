"""The dispatch cache's public face: statistics, reset, on/off."""

from __future__ import annotations

from tb_cython_dispatch import _impl, native


def cache_info() -> dict[str, dict[str, int]]:
    """Per op (``"nn.Sequential"``, ``"optim.Adam"``...): hits, misses, entries, invalidations, and
    ``native``: how many live entries run natively (one prepared program or eager kernel of an
    installed engine such as native_cpu, decided by timing)."""
    return _impl.core.CACHE.info()  # type: ignore[no-any-return]


def clear_cache() -> None:
    """Drop every cached resolution and zero the statistics."""
    _impl.core.CACHE.clear()


def cache_enabled() -> bool:
    return bool(_impl.core.CACHE.enabled)


def set_cache_enabled(enabled: bool) -> None:
    """The run-time form of ``TORCHBURN_DISPATCH_CACHE``: False means plain PyTorch paths."""
    _impl.core.CACHE.enabled = bool(enabled)


def set_native_enabled(enabled: bool) -> None:
    """False keeps every cached entry on its ATen path (bit-identical to PyTorch); True (the default)
    lets an entry that an installed engine can run decide by timing whether to (see
    ``tb_cython_dispatch.native``)."""
    native.set_native_enabled(enabled)


def native_enabled() -> bool:
    return native.native_enabled()


def native_available() -> tuple[bool, str]:
    """(True, "engine <name>") when an installed engine offers prepared programs (tb-core's
    ``Engine.prepare``; native_cpu from tb-cpu-rust does), else (False, the reason)."""
    return native.native_available()
