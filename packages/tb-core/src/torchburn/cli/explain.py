"""``torchburn explain``: partitions, engines and fallback reasons for a model."""

from __future__ import annotations

import argparse
import importlib

from torchburn.cli.command import Command


def run(args: argparse.Namespace) -> int:
    import torch

    import torchburn
    from torchburn.testing.models import MODELS

    if args.target in MODELS:
        model, example = MODELS[args.target]()
    elif ":" in args.target:
        module, _, attr = args.target.partition(":")
        model, example = getattr(importlib.import_module(module), attr)()
    else:
        raise ValueError(f"{args.target!r} is neither a model of the set ({', '.join(MODELS)}) nor module:factory")
    options = {"engine": args.engine} if args.engine else {}
    with torch.no_grad():
        print(torchburn.explain(model, *example, options=options, dynamic=bool(args.dynamic)))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", nargs="?", default="readme_mlp", help="a model-set name or module:factory returning (model, args)"
    )
    parser.add_argument("--engine", help="engine name or comma list")
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="trace the sizes as symbols (torch.compile(dynamic=True)): shows what is specialised per shape",
    )


COMMAND = Command("explain", "Show how a model is partitioned and why any op falls back.", run, add_arguments)
