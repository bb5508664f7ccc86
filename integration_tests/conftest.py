from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import torchburn
from torchburn import plugins


def installed_engines() -> list[str]:
    plugins.reload()
    return sorted(name for name, engine in plugins.engines().items() if engine.is_available() and name != "example")


ENGINES = installed_engines()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    torch._dynamo.reset()
    torchburn.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchburn.TorchburnFallbackWarning)
        yield
