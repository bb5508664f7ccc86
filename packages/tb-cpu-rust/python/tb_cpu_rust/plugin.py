"""Entry-point module of the native_cpu engine. Imports cheaply: no torch, no native module."""

from __future__ import annotations

from typing import Any

import torchburn

PLUGIN_API_VERSION = 1


@torchburn.hookimpl
def tb_register_engines() -> list[Any]:
    from tb_cpu_rust.engine import NativeCpuEngine

    return [NativeCpuEngine]
