"""Every installed engine, alone and in a priority list, on the model set: inference and training."""

from __future__ import annotations

import pytest
import torch
from conftest import ENGINES

import torchburn
from torchburn.testing.models import MODELS, train_losses

CHOICES = [*ENGINES, *([",".join(ENGINES), ",".join(reversed(ENGINES))] if len(ENGINES) > 1 else [])]


def test_some_engine_is_installed() -> None:
    assert ENGINES, "integration runs with every package installed; no engine is available"


@pytest.mark.parametrize("engine", CHOICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_matches_eager(engine: str, name: str) -> None:
    model, args = MODELS[name]()
    with torch.no_grad():
        expected = model(*args)
        actual = torch.compile(model, backend="torchburn", options={"engine": engine})(*args)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    cov = torchburn.op_coverage()  # delegated: taken by the engine, run by PyTorch's kernel (cython_dispatch)
    assert cov["native"] or cov["delegated"], f"no op ran in {engine}"


@pytest.mark.parametrize("engine", CHOICES)
def test_training_matches_eager(engine: str) -> None:
    eager = train_losses(None, steps=5)
    compiled = train_losses(lambda m: torch.compile(m, backend="torchburn", options={"engine": engine}), steps=5)
    assert max(abs(a - b) for a, b in zip(eager, compiled)) <= 1e-4
