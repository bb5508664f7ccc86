"""The tb-core engine conformance suite on the wgpu engine."""

from __future__ import annotations

from typing import ClassVar

import torch

from torchburn.testing import EngineConformance


class TestWgpu(EngineConformance):
    engine = "wgpu"
    # int64 cases (add-int64, add-promote) must run natively too: shader-int64 or its emulation.
    native_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset({torch.float32, torch.int64})
    native_models: ClassVar[frozenset[str]] = frozenset(
        {"readme_mlp", "small_cnn", "transformer_layer", "tiny_causal_lm"}
    )
