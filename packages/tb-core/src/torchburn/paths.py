"""Where torchburn keeps what it remembers across processes. Imports nothing heavy: the CLI's
cached listing and an engine's adapter cache read it without importing torch."""

from __future__ import annotations

import os
import pathlib


def user_cache_dir() -> pathlib.Path | None:
    """The folder for facts worth keeping across processes (an engine's adapter list, say).

    ``TORCHBURN_CACHE_DIR`` when set (``0`` or ``off``: keep nothing), else ``$XDG_CACHE_HOME/torchburn``
    (``~/.cache/torchburn``). Not created here: a writer makes it when it first stores something.
    """
    raw = os.environ.get("TORCHBURN_CACHE_DIR", "").strip()
    if raw.lower() in ("0", "off", "false", "no"):
        return None
    if raw:
        return pathlib.Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "torchburn"
