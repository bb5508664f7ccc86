"""The built-in CLI commands run and say what they should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from torchburn.cli import listing_cache, main


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


# -- the remembered listing: `torchburn engines` in a fresh process -----------------------------
ENGINES_CHILD = """
import contextlib, io, json, sys
from torchburn.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(sys.argv[1:])
heavy = ("torch", "sympy", "transformers", "wgpu")
modules = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(json.dumps({"status": status, "out": out.getvalue(), "modules": modules}))
"""


def _engines_child(cache: Path, *argv: str, **env: str) -> dict[str, Any]:
    full = {**os.environ, "TORCHBURN_CACHE_DIR": str(cache), **env}
    out = subprocess.run(
        [sys.executable, "-c", ENGINES_CHILD, "engines", *argv], env=full, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == 0, got
    return got


def test_engines_probes_once_then_answers_without_importing_torch(tmp_path: Path) -> None:
    first = _engines_child(tmp_path, "--format", "json")
    live = json.loads(first["out"])
    assert "probed_at" not in live and "torch" in first["modules"]
    # probing loads every plugin, yet neither inductor nor Dynamo
    assert not [m for m in first["modules"] if m.startswith(("torch._inductor", "torch._dynamo"))], first["modules"]
    assert (tmp_path / listing_cache.CACHE_FILE).exists()

    second = _engines_child(tmp_path, "--format", "json")
    remembered = json.loads(second["out"])
    assert second["modules"] == []  # no torch, no plugin: the listing came from the cache
    assert remembered.pop("probed_at") > 0
    assert remembered == live

    text = _engines_child(tmp_path)
    assert text["modules"] == [] and "`torchburn engines --refresh` probes again" in text["out"]

    refreshed = _engines_child(tmp_path, "--refresh", "--format", "json")
    assert "torch" in refreshed["modules"] and "probed_at" not in json.loads(refreshed["out"])


def test_engines_probes_again_when_a_steering_variable_changes(tmp_path: Path) -> None:
    _engines_child(tmp_path, "--format", "json")
    assert _engines_child(tmp_path, "--format", "json")["modules"] == []
    changed = _engines_child(tmp_path, "--format", "json", TORCHBURN_DISABLED_PLUGINS="no-such-plugin")
    assert "torch" in changed["modules"] and "probed_at" not in json.loads(changed["out"])
    off = _engines_child(tmp_path, "--format", "json", TORCHBURN_CACHE_DIR="0")
    assert "torch" in off["modules"]


def test_listing_cache_refuses_corrupt_old_and_foreign_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path))
    path = tmp_path / listing_cache.CACHE_FILE
    assert listing_cache.load() is None  # nothing stored yet
    listing = {"in_force": ["x"], "engines": [], "plugins": []}
    listing_cache.store(listing)
    assert listing_cache.load() == {**listing, "probed_at": pytest.approx(time.time(), abs=60)}
    path.write_text(path.read_text()[:-20])  # truncated by a crash
    assert listing_cache.load() is None
    listing_cache.store(listing)  # the next probe rewrites it whole
    assert listing_cache.load() is not None
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "probed_at": time.time() - listing_cache.MAX_AGE_S - 1}))
    assert listing_cache.load() is None  # too old: facts the fingerprint cannot see may have changed
    path.write_text(json.dumps({**entry, "fingerprint": {**entry["fingerprint"], "torch": ["0.0", None]}}))
    assert listing_cache.load() is None  # another torch
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "0")
    listing_cache.store(listing)
    assert listing_cache.load() is None


def test_fingerprint_follows_a_plugin_package_s_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "tb_fingerprint_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = listing_cache._package_files("tb_fingerprint_probe")
    assert before and before == listing_cache._package_files("tb_fingerprint_probe")
    (package / "plugin.py").write_text("X = 22\n")  # an edited editable install: same version, new code
    assert listing_cache._package_files("tb_fingerprint_probe") != before
    (package / "_native.so").write_bytes(b"\0")  # a rebuilt extension
    assert len({before, listing_cache._package_files("tb_fingerprint_probe")}) == 2
    assert "tb_fingerprint_probe" not in sys.modules  # found, never imported
