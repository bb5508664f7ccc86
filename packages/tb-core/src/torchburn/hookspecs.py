"""pluggy hook specifications: the public extension surface of TorchBurn.

Every hook is called with keyword arguments only (pluggy's rule). Built-in engines register
through these same hooks. Exact signatures and examples: ``docs/plugins.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from torchburn.engine import Engine
    from torchburn.registry import KernelRegistry

PROJECT_NAME = "torchburn"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def tb_register_engines() -> list[Engine | type[Engine]]:  # type: ignore[empty-body]
    """Return the engines this plugin provides (instances or zero-argument classes).

    Creating an engine must be cheap: no device probing, no native import. Availability is
    asked later through ``Engine.is_available()``.
    """


@hookspec
def tb_register_kernels(registry: KernelRegistry) -> None:
    """Add kernels to any engine's table: ``registry.register(engine, op, kernel, checker)``.

    Called after every engine is registered, so third-party kernel packs can extend other engines:
    those whose ``Engine.runs_registered_kernels()`` holds (tb-core's default ``Engine``,
    ``cython_dispatch``) run them; kernels for an installed engine that does not are reported.
    """


@hookspec
def tb_register_commands() -> list[Any]:  # type: ignore[empty-body]
    """Return ``torchburn.cli.Command`` objects that become ``torchburn <name>`` sub-commands."""


@hookspec
def tb_register_llm_backends() -> list[Any]:  # type: ignore[empty-body]
    """Return ``torchburn.llm_backend.LLMBackend`` descriptors that tb-llm may run on."""
