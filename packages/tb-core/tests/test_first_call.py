"""What a fresh process pays before its first compile: ``import torchburn`` loads neither torch nor
a plugin, and the public names it exports load on first use, each from its own module."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torchburn


def _child(code: str) -> object:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_torchburn_loads_neither_torch_nor_a_plugin() -> None:
    got = _child("""
        import json, sys
        import torchburn
        heavy = sorted(m for m in sys.modules if m.split(".")[0] == "torch" or m.startswith("tb_"))
        print(json.dumps({"heavy": heavy, "version": torchburn.__version__, "hookimpl": callable(torchburn.hookimpl)}))
    """)
    assert got == {"heavy": [], "version": torchburn.__version__, "hookimpl": True}


def test_exported_names_load_on_first_use() -> None:
    got = _child("""
        import json, sys
        import torchburn
        engine = torchburn.Engine  # loads torchburn.engine (and torch) now
        loaded = "torchburn.engine" in sys.modules and "torch" in sys.modules
        import torchburn.explain  # the module does not take the function's name
        print(json.dumps({
            "loaded": loaded,
            "explain_is_function": callable(torchburn.explain) and not isinstance(torchburn.explain, type(sys)),
            "submodule": torchburn.plugins.__name__,  # a submodule nobody imported yet
            "all": sorted(n for n in torchburn.__all__ if getattr(torchburn, n, None) is None),
        }))
    """)
    assert got == {"loaded": True, "explain_is_function": True, "submodule": "torchburn.plugins", "all": []}


def test_exported_names_are_the_defining_modules_objects() -> None:
    from torchburn.engine import Engine
    from torchburn.explain import explain
    from torchburn.options import select_engines
    from torchburn.telemetry import op_coverage

    assert torchburn.Engine is Engine and torchburn.explain is explain
    assert torchburn.select_engines is select_engines and torchburn.op_coverage is op_coverage
    assert not hasattr(torchburn, "no_such_name")
    assert set(torchburn.__all__) <= set(dir(torchburn))
