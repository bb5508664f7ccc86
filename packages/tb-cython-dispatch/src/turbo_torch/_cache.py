"""The dispatch cache's public face: statistics, reset, on/off."""

from __future__ import annotations

from tb_cython_dispatch import _impl


def cache_info() -> dict[str, dict[str, int]]:
    """Per op (``"nn.Sequential"``, ``"optim.Adam"``...): hits, misses, entries, invalidations."""
    return _impl.core.CACHE.info()  # type: ignore[no-any-return]


def clear_cache() -> None:
    """Drop every cached resolution and zero the statistics."""
    _impl.core.CACHE.clear()


def cache_enabled() -> bool:
    return bool(_impl.core.CACHE.enabled)


def set_cache_enabled(enabled: bool) -> None:
    """The run-time form of ``TORCHBURN_DISPATCH_CACHE``: False means plain PyTorch paths."""
    _impl.core.CACHE.enabled = bool(enabled)
