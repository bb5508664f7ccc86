"""The ``torchburn`` command line: engines, ops, doctor, demo, explain, and plugin commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from torchburn.cli.command import Command


def builtin_commands() -> list[Command]:
    from torchburn.cli import demo, doctor, engines, explain, ops

    return [engines.COMMAND, ops.COMMAND, doctor.COMMAND, demo.COMMAND, explain.COMMAND]


def build_parser(commands: list[Command]) -> argparse.ArgumentParser:
    from torchburn import __version__

    parser = argparse.ArgumentParser(prog="torchburn", description="TorchBurn: fast PyTorch on the hardware you have.")
    parser.add_argument("--version", action="version", version=f"tb-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        if command.add_arguments is not None:
            command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = builtin_commands()
    names = {c.name for c in commands}
    # Plugin commands need every plugin loaded (and with them torch): only for a command that is
    # not built in, or for help that lists them all.
    if next((a for a in argv if not a.startswith("-")), None) not in names:
        from torchburn.plugins import state

        for command in state().commands:
            if isinstance(command, Command) and command.name not in names:
                commands.append(command)
                names.add(command.name)
    parser = build_parser(commands)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a clear one-line message, not a traceback, for user errors
        if getattr(args, "debug", False):
            raise
        print(f"torchburn {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


__all__ = ["Command", "main"]
