"""The fake engine these tests run turbo_torch's native paths on passes tb-core's interop suite,
so what the tests check on it holds for any engine that passes the same suite (native_cpu does)."""

from __future__ import annotations

from typing import Any

import pytest

from torchburn.testing.interop_conformance import InteropConformance


class TestFakeEngineInterop(InteropConformance):
    engine = "fake_interop"
    eager_ops = frozenset({"aten.sin.default", "aten.cos.default", "aten.tanh.default"})

    @pytest.fixture(autouse=True)
    def _registered(self, fake_engine: Any) -> None:
        pass
