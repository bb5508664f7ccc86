"""Skip the whole suite, with the reason, only when no WebGPU adapter exists at all."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tb_wgpu.device import probe

    ctx, reason = probe()
    if ctx is not None:
        return
    skip = pytest.mark.skip(reason=f"no WebGPU adapter: {reason}")
    for item in items:
        item.add_marker(skip)
