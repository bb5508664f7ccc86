"""``torchburn engines``: installed engines, availability, and every plugin with its status.

A fresh process answers from the listing remembered by the last live probe when nothing it
depends on changed (``torchburn.cli.listing_cache``), without importing torch or any plugin;
``--refresh`` probes live. A process that has loaded plugins already always lists them live.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from torchburn.cli.command import Command
from torchburn.cli.table import render_table


def collect() -> dict[str, object]:
    from torchburn.options import Options, select_engines
    from torchburn.plugins import state

    st = state()
    try:
        in_force = [e.name for e in select_engines(Options(warn=False))]
    except Exception as exc:
        in_force = [f"error: {exc}"]
    engines = []
    for name, rec in sorted(st.engines.items()):
        try:
            available = rec.engine.is_available()
            ok, reason = available.ok, available.reason
        except Exception as exc:
            ok, reason = False, f"is_available raised {type(exc).__name__}: {exc}"
        try:
            details = rec.engine.describe() if ok else {}
        except Exception as exc:
            details = {"describe": f"raised {exc}"}
        engines.append(
            {
                "name": name,
                "version": rec.engine.version(),
                "device": rec.engine.device,
                "priority": rec.engine.priority,
                "available": ok,
                "reason": reason,
                "plugin": rec.plugin,
                "kernels": len(rec.engine.kernels()),
                "details": details,
            }
        )
    plugins = [
        {
            "name": r.name,
            "distribution": r.distribution,
            "version": r.version,
            "status": r.status,
            "reason": r.reason,
            "engines": r.engines,
        }
        for r in st.records
    ]
    return {"in_force": in_force, "engines": engines, "plugins": plugins}


def listing(refresh: bool = False) -> dict[str, Any]:
    """``collect()``'s answer, from the remembered listing when it still holds (``probed_at`` set)."""
    from torchburn.cli import listing_cache

    plugins = sys.modules.get("torchburn.plugins")
    if plugins is not None and (plugins._state is not None or plugins._extra):
        return collect()  # this process's own plugins (and any registered in-process) are the truth
    key = listing_cache.fingerprint()
    if not refresh:
        cached = listing_cache.load(key)
        if cached is not None:
            return cached
    data = collect()
    listing_cache.store(data, key)
    return data


def run(args: argparse.Namespace) -> int:
    data = listing(refresh=bool(getattr(args, "refresh", True)))
    if args.format == "json":
        print(json.dumps(data, indent=2, default=str))
        return 0
    engines = data["engines"]
    assert isinstance(engines, list)
    rows = [
        [e["name"], e["version"], e["device"], "yes" if e["available"] else f"no: {e['reason']}", str(e["priority"])]
        for e in engines
    ]
    print(
        render_table(["engine", "version", "device", "available", "priority"], rows)
        if rows
        else "no engines installed (pip install tb-cpu-rust)"
    )
    for e in engines:
        if e["details"]:
            print(f"  {e['name']}: " + ", ".join(f"{k}={v}" for k, v in e["details"].items()))
    print(f"\nin force: {', '.join(data['in_force']) or 'eager only'}")  # type: ignore[arg-type]
    plugins = data["plugins"]
    assert isinstance(plugins, list)
    if plugins:
        print()
        rows = [[p["name"], p["distribution"], p["version"], p["status"], p["reason"]] for p in plugins]
        print(render_table(["plugin", "distribution", "version", "status", "reason"], rows))
    probed_at = data.get("probed_at")
    if isinstance(probed_at, float):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(probed_at))
        print(f"\n(as probed at {when}, nothing relevant changed since; `torchburn engines --refresh` probes again)")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="load the plugins and probe the engines now, not the listing remembered from the last probe",
    )


COMMAND = Command("engines", "List engines and plugins, with availability and why not.", run, add_arguments)
