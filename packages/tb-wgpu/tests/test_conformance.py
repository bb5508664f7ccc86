"""The tb-core engine conformance suite on the wgpu engine."""

from __future__ import annotations

from torchburn.testing import EngineConformance


class TestWgpu(EngineConformance):
    engine = "wgpu"
    xfail = {
        "rms_norm": (
            "F.rms_norm reaches the backend already decomposed (pow/mean/rsqrt/mul, all native on wgpu): "
            "aten._fused_rms_norm is never in the captured graph, so the case cannot see it native"
        ),
    }
    native_models = frozenset({"readme_mlp", "small_cnn", "transformer_layer"})
