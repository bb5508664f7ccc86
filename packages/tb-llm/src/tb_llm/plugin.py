"""Entry point ``torchburn: llm``: adds ``torchburn llm ...``. Imports cheaply (no torch)."""

from __future__ import annotations

import argparse
from typing import Any

import torchburn

PLUGIN_API_VERSION = 1


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from tb_llm.cli import add_arguments

    add_arguments(parser)


def _run(args: argparse.Namespace) -> int:
    from tb_llm.cli import run

    return run(args)


@torchburn.hookimpl
def tb_register_commands() -> list[Any]:
    from torchburn.cli.command import Command

    return [
        Command(
            name="llm",
            help="run Hugging Face LLM checkpoints: chat, generate, benchmark",
            run=_run,
            add_arguments=_add_arguments,
        )
    ]
