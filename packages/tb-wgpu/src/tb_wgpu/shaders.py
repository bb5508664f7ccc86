"""WGSL sources: package files read with importlib.resources, filled in by ``{{NAME}}`` templates."""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources

_TOKEN = re.compile(r"\{\{([A-Z0-9_]+)\}\}")


@functools.cache
def source(name: str) -> str:
    """The text of ``shaders/<name>.wgsl``."""
    return resources.files("tb_wgpu").joinpath("shaders", f"{name}.wgsl").read_text(encoding="utf-8")


def render(name: str, **subs: object) -> str:
    """``source(name)`` with every ``{{KEY}}`` replaced by ``subs[KEY]``; a missing key is an error."""

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key == "PRELUDE" and key not in subs:
            return source("prelude")
        if key == "ENABLE" and key not in subs:
            return ""
        if key not in subs:
            raise KeyError(f"shader {name}.wgsl needs a value for {{{{{key}}}}}")
        return str(subs[key])

    return _TOKEN.sub(fill, source(name))


def shader_key(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
