"""Which implementation of the hot loops is in force: the Cython extension or the fallback."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

IMPL_ENV = "TORCHBURN_DISPATCH_IMPL"  # "compiled" (default when built), "python"
CACHE_ENV = "TORCHBURN_DISPATCH_CACHE"  # "0" turns the dispatch cache off

try:
    from tb_cython_dispatch import _dispatch as _compiled
except ImportError as exc:  # an sdist built without a compiler, say
    _compiled = None  # type: ignore[assignment]
    COMPILED_IMPORT_ERROR: str = f"{type(exc).__name__}: {exc}"
else:
    COMPILED_IMPORT_ERROR = ""

from tb_cython_dispatch import _fallback  # noqa: E402 - after the optional extension on purpose

COMPILED_AVAILABLE = _compiled is not None

_listeners: list[Callable[[ModuleType], None]] = []


def _initial() -> ModuleType:
    wanted = os.environ.get(IMPL_ENV, "").strip().lower()
    if wanted not in ("", "compiled", "python"):
        raise ValueError(f"{IMPL_ENV} must be 'compiled' or 'python', not {wanted!r}")
    if wanted == "python" or _compiled is None:
        return _fallback
    return _compiled


def _cache_enabled_from_env() -> bool:
    return os.environ.get(CACHE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


core: ModuleType = _initial()
for _m in (_compiled, _fallback):
    if _m is not None:
        _m.CACHE.enabled = _cache_enabled_from_env()


def implementation() -> str:
    """ "compiled" or "python": which implementation of the hot loops is in force."""
    return str(core.IMPLEMENTATION)


def set_implementation(name: str) -> ModuleType:
    """Switch between "compiled" and "python" at run time (tests run the same suite on both)."""
    global core
    if name == "compiled":
        if _compiled is None:
            raise ImportError(
                f"the compiled extension tb_cython_dispatch._dispatch is not available ({COMPILED_IMPORT_ERROR})"
            )
        module: ModuleType = _compiled
    elif name == "python":
        module = _fallback
    else:
        raise ValueError(f"implementation must be 'compiled' or 'python', not {name!r}")
    module.CACHE.enabled = core.CACHE.enabled
    core = module
    for listener in _listeners:
        listener(module)
    return module


def on_change(listener: Callable[[ModuleType], None]) -> None:
    """Call ``listener(core)`` now and whenever the implementation changes."""
    _listeners.append(listener)
    listener(core)
