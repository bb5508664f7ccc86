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
    return resources.files("tb_wgpu").joinpath("shaders").joinpath(f"{name}.wgsl").read_text(encoding="utf-8")


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


def with_int64(text: str, native: bool) -> str:
    """``text`` with the int64 helpers prepended when it uses ``tb_i64`` (after any ``enable``).

    ``native``: WGSL ``i64`` (the device was opened with ``shader-int64``); otherwise ``vec2<u32>``
    words with emulated arithmetic. Both store the 8 bytes of ``torch.int64``, so the choice is
    made here, once per kernel, and the lowering never sees it.
    """
    if "tb_i64" not in text:
        return text
    prelude = source("int64_native" if native else "int64_emulated")
    lines = text.split("\n")
    head = 0
    while head < len(lines) and lines[head].startswith("enable "):
        head += 1
    return "\n".join([*lines[:head], prelude, *lines[head:]])


_BINDING = re.compile(
    r"@group\(0\)\s*@binding\((\d+)\)\s*var<storage,\s*(read|read_write)>\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*array<f32>;"
)


def _closing(text: str, start: int, open_: str, close: str) -> int:
    """Index of the ``close`` matching the ``open_`` at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced {open_!r} in a WGSL kernel")


def _statement_end(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == ";" and depth == 0:
            return i
    raise ValueError("an unterminated statement in a WGSL kernel")


def to_half(text: str, half_bindings: set[int]) -> str:
    """``text`` with the ``array<f32>`` storage bindings numbered in ``half_bindings`` stored as f16.

    Every kernel computes in f32 registers; only storage changes: the binding becomes
    ``array<f16>``, each read ``name[i]`` becomes ``f32(name[i])`` and each write
    ``name[i] = v;`` becomes ``name[i] = f16(v);`` (rounded to nearest, as torch rounds an f32
    result to float16). Needs the device's ``shader-f16`` feature (``enable f16;`` is prepended).
    """
    if not half_bindings:
        return text
    text = re.sub(r"//[^\n]*", "", text)  # comments mention bindings too ("out[b] = a @ b")
    names: list[str] = []

    def retype(match: re.Match[str]) -> str:
        if int(match.group(1)) not in half_bindings:
            return match.group(0)
        names.append(match.group(3))
        return match.group(0).replace("array<f32>", "array<f16>")

    text = _BINDING.sub(retype, text)
    if len(names) != len(half_bindings):
        raise ValueError(f"a kernel lacks array<f32> bindings {sorted(half_bindings)} to store as f16")
    for name in names:
        text = _rewrite(text, re.compile(r"(?<![A-Za-z0-9_.])" + re.escape(name) + r"\["), name)
    return "enable f16;\n" + text


def _rewrite(text: str, pattern: re.Pattern[str], name: str) -> str:
    out: list[str] = []
    pos = 0
    while True:
        match = pattern.search(text, pos)
        if match is None:
            out.append(text[pos:])
            return "".join(out)
        start = match.start()
        close = _closing(text, match.end() - 1, "[", "]")
        out.append(text[pos:start])
        access = text[start : close + 1]
        rest = text[close + 1 :]
        stripped = rest.lstrip()
        if stripped.startswith("=") and not stripped.startswith("=="):
            eq = close + 1 + (len(rest) - len(stripped))
            end = _statement_end(text, eq + 1)
            out.append(f"{access} = f16({_rewrite(text[eq + 1 : end].strip(), pattern, name)})")
            pos = end
        elif stripped[:2] in ("+=", "-=", "*=", "/="):
            raise ValueError(f"compound assignment to f16 storage {name} is not supported")
        else:
            out.append(f"f32({access})")
            pos = close + 1
