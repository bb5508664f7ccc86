"""``turbo_torch.nn``: ``torch.nn`` with a fast ``__call__`` on every module class.

``turbo_torch.nn.Module`` subclasses ``torch.nn.Module``; every other module class here
(``Linear``, ``Sequential``, ``Conv2d``...) is made on first use as a subclass of the torch class
and ``turbo_torch.nn.Module``, so ``isinstance(m, torch.nn.Linear)`` holds, ``state_dict`` keys are
the same, and the class pickles by its name here. Everything that is not a module class
(``Parameter``, ``functional``, ``init``, ``utils``) is torch's own object.
"""

from __future__ import annotations

from typing import Any

import torch.nn as _tnn

from turbo_torch.nn._module import Module as Module
from turbo_torch.nn._module import make_class

Sequential = make_class(_tnn.Sequential)
Linear = make_class(_tnn.Linear)
ReLU = make_class(_tnn.ReLU)

functional = _tnn.functional
init = _tnn.init
Parameter = _tnn.Parameter


def __getattr__(name: str) -> Any:
    value = getattr(_tnn, name)  # AttributeError says "torch.nn has no attribute ..."
    if isinstance(value, type) and issubclass(value, _tnn.Module):
        value = make_class(value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_tnn)))
