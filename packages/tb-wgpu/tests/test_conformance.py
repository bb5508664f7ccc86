"""The tb-core engine conformance suite on the wgpu engine."""

from __future__ import annotations

from typing import ClassVar

from torchburn.testing import EngineConformance


class TestWgpu(EngineConformance):
    engine = "wgpu"
    xfail: ClassVar[dict[str, str]] = {
        "rms_norm": (
            "F.rms_norm reaches the backend already decomposed (pow/mean/rsqrt/mul, all native on wgpu): "
            "aten._fused_rms_norm is never in the captured graph, so the case cannot see it native"
        ),
    }
    native_models: ClassVar[frozenset[str]] = frozenset({"readme_mlp", "small_cnn", "transformer_layer"})
