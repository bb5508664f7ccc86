"""Engine selection opens no device, and the adapter found is remembered across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tb_wgpu import adapters
from tb_wgpu import device as gpu


def _child(code: str, cache: Path, **env: str) -> dict[str, Any]:
    """Run `code` in a fresh interpreter with the cache in `cache`; it prints one JSON line last."""
    full = {**os.environ, "TORCHBURN_CACHE_DIR": str(cache), **env}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SELECT = """
    import json, sys
    import torchburn
    engine = torchburn.plugins.engines()["wgpu"]
    ok, priority = bool(engine.is_available()), engine.priority
    from tb_wgpu import adapters, device
    print(json.dumps({"ok": ok, "priority": priority, "source": adapters.source,
                      "device_opened": device._CONTEXT is not None, "wgpu_imported": "wgpu" in sys.modules}))
"""


def test_selection_opens_no_device_and_a_second_process_reads_the_cache(tmp_path: Path) -> None:
    first = _child(SELECT, tmp_path)
    assert first["ok"] and first["source"] == "enumerated"
    assert not first["device_opened"]
    assert (tmp_path / adapters.CACHE_FILE).exists()
    second = _child(SELECT, tmp_path)
    assert second == {**first, "source": "cache", "wgpu_imported": False}


def test_a_changed_fingerprint_enumerates_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path))
    adapters.forget()
    first = adapters.adapter_info()
    assert adapters.source == "enumerated"
    adapters.forget()
    assert adapters.adapter_info() == first and adapters.source == "cache"
    # a driver manifest appears (an install or upgrade of a Vulkan driver)
    manifest = tmp_path / "fake_icd.json"
    manifest.write_text(json.dumps({"ICD": {"library_path": str(tmp_path / "libfake.so")}}))
    monkeypatch.setenv("VK_ADD_DRIVER_FILES", str(manifest))
    adapters.forget()
    adapters.adapter_info()
    assert adapters.source == "enumerated"
    adapters.forget()
    adapters.adapter_info()
    assert adapters.source == "cache"
    manifest.write_text(json.dumps({"ICD": {"library_path": "/elsewhere/libfake.so"}}))  # the driver changed
    os.utime(manifest, ns=(1, 1))
    adapters.forget()
    adapters.adapter_info()
    assert adapters.source == "enumerated"
    adapters.forget()


def test_a_corrupt_cache_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path))
    (tmp_path / adapters.CACHE_FILE).write_text('{"fingerprint": {"format": 1}, "adapt')
    adapters.forget()
    found, reason = adapters.adapter_info()
    assert adapters.source == "enumerated"
    assert found is not None, reason
    assert json.loads((tmp_path / adapters.CACHE_FILE).read_text())["adapter"]["name"] == found.name
    adapters.forget()


def test_cache_off_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "0")
    monkeypatch.chdir(tmp_path)
    adapters.forget()
    adapters.adapter_info()
    adapters.forget()
    adapters.adapter_info()
    assert adapters.source == "enumerated"
    assert not list(tmp_path.iterdir())
    adapters.forget()


def test_adapter_facts_match_the_opened_device() -> None:
    adapters.forget()
    found, reason = adapters.adapter_info()
    assert found is not None, reason
    ctx = gpu.context()
    assert (found.name, found.backend, found.adapter_type) == (ctx.adapter_name, ctx.backend, ctx.adapter_type)
    assert (found.shader_f16, found.shader_int64) == (ctx.shader_f16, ctx.shader_int64)
    assert found.max_binding == ctx.max_binding
    assert found.is_software == ctx.is_software
