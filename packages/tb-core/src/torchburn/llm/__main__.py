"""``python -m torchburn.llm chat|generate|benchmark ...``: tb-llm's command line, when installed."""

from __future__ import annotations

import importlib.util
import sys


def main(argv: list[str] | None = None) -> int:
    if importlib.util.find_spec("tb_llm") is None:
        print("python -m torchburn.llm needs the tb-llm package: pip install tb-llm", file=sys.stderr)
        return 2
    from tb_llm.cli import main as tb_llm_main

    return int(tb_llm_main(argv))


if __name__ == "__main__":
    raise SystemExit(main())
