"""The kernel registry: engine -> op overload -> kernel + checker.

Kernel tables are data keyed by op name. Engines fill their own table; third-party kernel packs
add to any engine's table through the ``tb_register_kernels`` hook. Only engines whose
``Engine.runs_registered_kernels()`` holds run what is added: the default ``Engine`` (every
engine built on ``KernelProgram``, the example engine) and ``cython_dispatch``; tb-core warns
about kernels registered for an installed engine that does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torchburn.nodeinfo import NodeInfo

# A checker returns None when it accepts the node, else the reason it does not.
Checker = Callable[[NodeInfo], "str | None"]


@dataclass(frozen=True)
class Kernel:
    op: str
    fn: Callable[..., Any]
    checker: Checker | None
    source: str  # who registered it (plugin or package name)


class KernelRegistry:
    def __init__(self) -> None:
        self._tables: dict[str, dict[str, Kernel]] = {}

    def register(
        self,
        engine: str,
        op: Any,
        fn: Callable[..., Any],
        checker: Checker | None = None,
        *,
        source: str = "",
    ) -> None:
        """Register ``fn`` as ``engine``'s kernel for ``op`` (an OpOverload or its name).

        A later registration for the same (engine, op) replaces the earlier one: kernel packs
        may override built-in kernels on purpose.
        """
        name = op if isinstance(op, str) else str(op)
        if name.count(".") != 2:
            raise ValueError(f"op must be an overload such as 'aten.add.Tensor', not {name!r}")
        self._tables.setdefault(engine, {})[name] = Kernel(name, fn, checker, source)

    def register_many(
        self,
        engine: str,
        kernels: Iterable[tuple[Any, Callable[..., Any]]],
        checker: Checker | None = None,
        *,
        source: str = "",
    ) -> None:
        for op, fn in kernels:
            self.register(engine, op, fn, checker, source=source)

    def lookup(self, engine: str, op: str) -> Kernel | None:
        return self._tables.get(engine, {}).get(op)

    def table(self, engine: str) -> dict[str, Kernel]:
        return dict(self._tables.get(engine, {}))

    def snapshot(self) -> dict[str, dict[str, Kernel]]:
        """A copy of every table (to see what one plugin's hook added)."""
        return {engine: dict(table) for engine, table in self._tables.items()}

    def engines(self) -> list[str]:
        return sorted(self._tables)

    def clear(self) -> None:
        self._tables.clear()
