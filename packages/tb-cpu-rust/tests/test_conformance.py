"""native_cpu against the tb-core conformance suite and model set."""

from __future__ import annotations

from typing import ClassVar

import torchburn
from torchburn.testing import EngineConformance


def test_engine_is_found_through_its_entry_point() -> None:
    assert "native_cpu" in torchburn.plugins.engines()


class TestNativeCpu(EngineConformance):
    engine = "native_cpu"
    native_models = frozenset({"readme_mlp", "small_cnn", "transformer_layer", "tiny_causal_lm"})
    xfail: ClassVar[dict[str, str]] = {}
