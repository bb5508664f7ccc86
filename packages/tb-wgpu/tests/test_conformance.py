"""The tb-core engine conformance suite on the wgpu engine."""

from __future__ import annotations

from typing import ClassVar

from torchburn.testing import EngineConformance


class TestWgpu(EngineConformance):
    engine = "wgpu"
    native_models: ClassVar[frozenset[str]] = frozenset({"readme_mlp", "small_cnn", "transformer_layer"})
