"""Plugins from entry points: broken, incompatible, hanging, disabled — never fatal."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

GOOD = """
import torchburn
PLUGIN_API_VERSION = 1
class GoodEngine(torchburn.Engine):
    name = "good"
@torchburn.hookimpl
def tb_register_engines():
    return [GoodEngine]
@torchburn.hookimpl
def tb_register_commands():
    from torchburn.cli.command import Command
    return [Command("hello", "say hello", lambda args: print("hello from plugin") or 0)]
"""
BROKEN = "raise ImportError('this plugin is broken on purpose')\n"
OLD_API = """
import torchburn
PLUGIN_API_VERSION = 0
@torchburn.hookimpl
def tb_register_engines():
    return []
"""
OLD_ENGINE = """
import torchburn
class OldEngine(torchburn.Engine):
    name = "old"
    plugin_api_version = 99
@torchburn.hookimpl
def tb_register_engines():
    return [OldEngine]
"""
HANGS = "import time\ntime.sleep(600)\n"

PLUGINS = {"good": GOOD, "broken": BROKEN, "oldapi": OLD_API, "oldengine": OLD_ENGINE, "hangs": HANGS}


@pytest.fixture
def site(tmp_path: pathlib.Path) -> pathlib.Path:
    """A directory that importlib.metadata sees as five installed distributions."""
    for name, source in PLUGINS.items():
        (tmp_path / f"tbfake_{name}.py").write_text(textwrap.dedent(source))
        dist = tmp_path / f"tbfake_{name}-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tbfake-{name}\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(f"[torchburn]\n{name} = tbfake_{name}\n")
    return tmp_path


def torchburn_cli(site: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TORCHBURN_")}
    environment.update({"PYTHONPATH": str(site), "TORCHBURN_PLUGIN_IMPORT_TIMEOUT": "2", **env})
    return subprocess.run(
        [sys.executable, "-m", "torchburn", *args], capture_output=True, text=True, env=environment, timeout=300
    )


def test_engines_lists_every_plugin_with_its_reason(site: pathlib.Path) -> None:
    out = torchburn_cli(site, "engines", "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    plugins = {p["name"]: p for p in data["plugins"]}
    assert plugins["good"]["status"] == "loaded"
    assert plugins["broken"]["status"] == "broken"
    assert "this plugin is broken on purpose" in plugins["broken"]["reason"]
    assert plugins["oldapi"]["status"] == "incompatible"
    assert "plugin API 0" in plugins["oldapi"]["reason"] and "install" in plugins["oldapi"]["reason"]
    assert plugins["oldengine"]["status"] == "incompatible"
    assert "plugin API 99" in plugins["oldengine"]["reason"]
    assert plugins["hangs"]["status"] == "timeout"
    assert "good" in [e["name"] for e in data["engines"]]
    assert "old" not in [e["name"] for e in data["engines"]]
    # one warning for all of them, on stderr
    assert out.stderr.count("TorchburnPluginWarning") == 1


def test_text_output_and_plugin_command(site: pathlib.Path) -> None:
    out = torchburn_cli(site, "engines", TORCHBURN_DISABLED_PLUGINS="hangs")
    assert out.returncode == 0
    assert "broken on purpose" in out.stdout and "disabled" in out.stdout
    hello = torchburn_cli(site, "hello", TORCHBURN_LOAD_PLUGINS="good", TORCHBURN_TRACE_PLUGINS="1")
    assert hello.returncode == 0 and "hello from plugin" in hello.stdout
    assert "[torchburn] loaded entry point good" in hello.stderr


def test_import_torchburn_survives_broken_plugins(site: pathlib.Path) -> None:
    code = "import torchburn, torch; print('good' in torchburn.active_engines())"
    environment = {**os.environ, "PYTHONPATH": str(site), "TORCHBURN_PLUGIN_IMPORT_TIMEOUT": "2"}
    environment.pop("TORCHBURN_LOAD_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_allow_list(site: pathlib.Path) -> None:
    out = torchburn_cli(site, "engines", "--format", "json", TORCHBURN_LOAD_PLUGINS="good")
    plugins = {p["name"]: p["status"] for p in json.loads(out.stdout)["plugins"] if p["name"] in PLUGINS}
    assert plugins == {
        "good": "loaded",
        "broken": "not allowed",
        "oldapi": "not allowed",
        "oldengine": "not allowed",
        "hangs": "not allowed",
    }
    assert "TorchburnPluginWarning" not in out.stderr
