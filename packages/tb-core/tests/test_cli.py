"""The built-in CLI commands run and say what they should."""

from __future__ import annotations

import json
from typing import Any

import pytest

from torchburn.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_engines_and_ops(capsys: pytest.CaptureFixture[str], toy: Any) -> None:
    out = run(capsys, "engines")
    assert "toy" in out and "in force: toy" in out
    data = json.loads(run(capsys, "ops", "--format", "json"))
    assert data["engines"] == ["toy"]
    rows = {r["op"]: r for r in data["ops"]}
    assert rows["aten.addmm.default"]["toy"] is True and rows["aten.gelu.default"]["toy"] is False
    assert len(rows) > 190
    md = run(capsys, "ops", "--format", "md")
    assert md.startswith("| op | category | toy |")


def test_doctor(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "doctor")
    for field in ("tb-core", "torch", "cpu features", "gpu adapters", "graph cache"):
        assert field in out


def test_demo_checks_against_eager(capsys: pytest.CaptureFixture[str], toy: Any) -> None:
    out = run(capsys, "demo", "--repeats", "1")
    assert "matches eager" in out and "engines in force: toy" in out
    assert "aten.addmm.default×2" in out


def test_explain(capsys: pytest.CaptureFixture[str], toy: Any) -> None:
    out = run(capsys, "explain", "readme_mlp")
    assert "partition 0 on toy" in out and "aten.addmm.default×2" in out


def test_bad_target_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "no_such_model"]) == 1
    assert "neither a model of the set" in capsys.readouterr().err
