"""A real engine failing at compile or run time for one partition: eager answer, a warning."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import ENGINES

import torchburn
from torchburn import plugins
from torchburn.testing.models import readme_mlp


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("when", ["compile", "run"])
def test_engine_failure_falls_back(engine: str, when: str, monkeypatch: pytest.MonkeyPatch) -> None:
    instance = plugins.engines()[engine]
    original = type(instance).compile

    def failing_compile(self: Any, plan: Any) -> Any:
        if when == "compile":
            raise RuntimeError("injected compile failure")
        compiled = original(self, plan)

        def run(*args: Any) -> Any:
            raise RuntimeError("injected run failure")

        return run if compiled is not None else compiled

    monkeypatch.setattr(type(instance), "compile", failing_compile)
    torchburn.clear_cache()
    model, (x,) = readme_mlp(batch=4)
    with torch.no_grad():
        compiled = torch.compile(model, backend="torchburn", options={"engine": engine, "cache": False})
        with pytest.warns(torchburn.TorchburnFallbackWarning, match="injected|failed"):
            out = compiled(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
