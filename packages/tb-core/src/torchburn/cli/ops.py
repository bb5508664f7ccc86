"""``torchburn ops``: the op catalog against each engine's coverage."""

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
    rows = []
    for op, entry in sorted(CATALOG.items()):
        rows.append({"op": op, "category": entry.category, "core": entry.core, **{n: op in covered[n] for n in names}})
    return names, rows


def run(args: argparse.Namespace) -> int:
    names, rows = coverage(args.engine)
    if args.format == "json":
        print(json.dumps({"engines": names, "ops": rows}, indent=2))
        return 0
    headers = ["op", "category", *names]
    table = [[r["op"], r["category"], *("yes" if r[n] else "-" for n in names)] for r in rows]
    totals = ["total", f"{len(rows)} ops", *(str(sum(1 for r in rows if r[n])) for n in names)]
    render = render_markdown if args.format == "md" else render_table
    print(render(headers, [*table, totals]))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["text", "md", "json"], default="text")
    parser.add_argument("--engine", action="append", help="only this engine (repeatable)")


COMMAND = Command("ops", "Show the op catalog and which ops each engine runs natively.", run, add_arguments)
