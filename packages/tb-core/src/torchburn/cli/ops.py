"""``torchburn ops``: the op catalog against each engine's coverage.

Per engine an op is "native" (a kernel of the engine's own), "delegated" (the engine takes it but
runs PyTorch's own kernel, ``Engine.native_ops`` vs ``covered_ops``) or not covered.
"""

from __future__ import annotations

import argparse
import json

from torchburn.cli.command import Command
from torchburn.cli.table import render_markdown, render_table


def coverage(engine_filter: list[str] | None = None) -> tuple[list[str], list[dict[str, object]]]:
    from torchburn.catalog import CATALOG
    from torchburn.plugins import engines

    installed = engines()
    names = [n for n in sorted(installed) if not engine_filter or n in engine_filter]
    covered = {n: installed[n].covered_ops() for n in names}
    native = {n: installed[n].native_ops() & covered[n] for n in names}
    rows = []
    for op, entry in sorted(CATALOG.items()):
        rows.append(
            {
                "op": op,
                "category": entry.category,
                "core": entry.core,
                **{n: op in native[n] for n in names},
                "delegated": [n for n in names if op in covered[n] and op not in native[n]],
            }
        )
    return names, rows


def _delegated(row: dict[str, object], engine: str) -> bool:
    names = row["delegated"]
    return isinstance(names, list) and engine in names


def cell(row: dict[str, object], engine: str, native: str, delegated: str, absent: str) -> str:
    """How a table shows one engine's coverage of one op."""
    if row[engine]:
        return native
    return delegated if _delegated(row, engine) else absent


def totals(rows: list[dict[str, object]], engine: str) -> str:
    n_native = sum(1 for r in rows if r[engine])
    n_delegated = sum(1 for r in rows if _delegated(r, engine))
    return f"{n_native} (+{n_delegated} delegated)" if n_delegated else str(n_native)


def run(args: argparse.Namespace) -> int:
    names, rows = coverage(args.engine)
    if args.format == "json":
        print(json.dumps({"engines": names, "ops": rows}, indent=2))
        return 0
    headers = ["op", "category", *names]
    table = [[r["op"], r["category"], *(cell(r, n, "yes", "delegated", "-") for n in names)] for r in rows]
    total = ["total", f"{len(rows)} ops", *(totals(rows, n) for n in names)]
    render = render_markdown if args.format == "md" else render_table
    print(render(headers, [*table, total]))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["text", "md", "json"], default="text")
    parser.add_argument("--engine", action="append", help="only this engine (repeatable)")


COMMAND = Command(
    "ops", "Show the op catalog and which ops each engine runs natively or delegates to PyTorch.", run, add_arguments
)
