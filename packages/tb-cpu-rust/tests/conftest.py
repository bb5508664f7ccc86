"""Fixtures shared by the tb-cpu-rust tests."""

from __future__ import annotations

import json
from typing import Any

import pytest


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The lowered spec of every partition compiled while the test runs."""
    from tb_cpu_rust import lower as lower_mod
    from tb_cpu_rust import program

    seen: list[dict[str, Any]] = []

    def record(plan: Any) -> dict[str, Any]:
        result = lower_mod.lower(plan)
        seen.append(json.loads(result["json"]))
        return result

    monkeypatch.setattr(program, "lower", record)
    return seen
