"""A CLI sub-command that plugins contribute through ``tb_register_commands``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str  # `torchburn <name>`
    help: str
    run: Callable[[argparse.Namespace], int]  # returns the exit status
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
