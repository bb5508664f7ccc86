"""Write a plugin distribution built for another torchburn plugin API, to test that tb-core refuses it.

    python scripts/make_incompatible_plugin.py OUT_DIR    # run with the environment's python

The distribution `tb-future-engine` declares two entry points of group `torchburn`:
`future_module`, whose module says `PLUGIN_API_VERSION = <installed API + 1>`, and `future_engine`,
whose module is current but whose Engine class has `plugin_api_version = <installed API + 1>`.
`nox -s alacarte` installs it next to the tb-core wheel and runs
`smoke_install.py --expect-incompatible future_module,future_engine`: both must be refused with a
message naming the versions, and torchburn must still work (eager fallback).
"""

from __future__ import annotations

import pathlib
import sys
import textwrap

PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.24"]
build-backend = "hatchling.build"

[project]
name = "tb-future-engine"
version = "9.0.0"
requires-python = ">=3.10"
dependencies = ["tb-core"]

[project.entry-points.torchburn]
future_module = "tb_future_engine.module_plugin"
future_engine = "tb_future_engine.engine_plugin"

[tool.hatch.build.targets.wheel]
packages = ["tb_future_engine"]
"""

MODULE_PLUGIN = """\
import torchburn

PLUGIN_API_VERSION = {future}


class FutureEngine(torchburn.Engine):
    name = "future_module"
    device = "cpu"
    priority = 1000


@torchburn.hookimpl
def tb_register_engines():
    return [FutureEngine]
"""

ENGINE_PLUGIN = """\
import torchburn

PLUGIN_API_VERSION = {current}


class FutureEngine(torchburn.Engine):
    name = "future_engine"
    device = "cpu"
    priority = 1000
    plugin_api_version = {future}


@torchburn.hookimpl
def tb_register_engines():
    return [FutureEngine]
"""


def main() -> int:
    import torchburn

    out = pathlib.Path(sys.argv[1])
    current = torchburn.PLUGIN_API_VERSION
    package = out / "tb_future_engine"
    package.mkdir(parents=True, exist_ok=True)
    (out / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "module_plugin.py").write_text(textwrap.dedent(MODULE_PLUGIN.format(future=current + 1)))
    (package / "engine_plugin.py").write_text(ENGINE_PLUGIN.format(current=current, future=current + 1))
    print(f"wrote {out}: plugins built for API {current + 1}, installed tb-core provides {current}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
