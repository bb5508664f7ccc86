"""``import turbo_torch.X.Y`` for any ``torch.X.Y`` this package does not define itself.

The alias is the very module object of torch (no second copy), so ``turbo_torch.utils.data``
*is* ``torch.utils.data`` and isinstance checks, pickles and registries all agree.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

PREFIX = "turbo_torch."
# Submodules that exist as files of this package; everything else is an alias.
OWN = frozenset(
    {"turbo_torch._alias", "turbo_torch._cache", "turbo_torch._unary", "turbo_torch.nn", "turbo_torch.optim"}
)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: ModuleType) -> None:
        self.target = target
        self.spec = getattr(target, "__spec__", None)

    def create_module(self, spec: Any) -> ModuleType:
        return self.target

    def exec_module(self, module: ModuleType) -> None:
        # importlib stamped the alias spec onto torch's module; give it its own back.
        if self.spec is not None:
            module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PREFIX) or fullname in OWN:
            return None
        parent = fullname.rpartition(".")[0]
        if parent in OWN and importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
            return None  # a file of this package
        torch_name = "torch." + fullname[len(PREFIX) :]
        try:
            module = importlib.import_module(torch_name)
        except ImportError:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module), is_package=hasattr(module, "__path__"))


_FINDER = _AliasFinder()


def install() -> None:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _FINDER)
