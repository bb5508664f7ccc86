"""Accuracy of each quantization level against fp32 on the tiny test models -> docs/llm.md.

    python packages/tb-llm/scripts/quant_accuracy.py          # rewrite the table in docs/llm.md
    python packages/tb-llm/scripts/quant_accuracy.py --check  # fail if the table is stale

Needs transformers (to build the tiny random checkpoints, as the tests do). Metrics, teacher-
forced over a prompt plus 64 greedy fp32 tokens: top-1 agreement of the next-token argmax and
mean cosine similarity of the logit vectors.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "llm.md"
START, END = "<!-- quant-accuracy:start -->", "<!-- quant-accuracy:end -->"
LEVELS = [("bf16", 32), ("int8", 32), ("int4", 32), ("int4", 64), ("int4", 128)]


def table() -> str:
    import torch

    from tb_llm import LLM
    from tb_llm.quant_accuracy import compare
    from tb_llm.testing import ARCHS, make_checkpoint

    torch.set_num_threads(2)
    head = "| model | " + " | ".join(f"{q}{'/g' + str(g) if q == 'int4' else ''}" for q, g in LEVELS) + " |"
    lines = [head, "|" + " --- |" * (len(LEVELS) + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            folder = make_checkpoint(arch, Path(tmp) / arch)
            ref = LLM.from_pretrained(folder, quant="fp32", device="cpu")
            cells = []
            for quant, group in LEVELS:
                q = LLM.from_pretrained(folder, quant=quant, device="cpu", group_size=group)
                top1, cos = compare(ref, q, n_tokens=64)
                cells.append(f"{top1:.1%} / {cos:.4f}")
            lines.append(f"| {arch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    text = DOC.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"{DOC}: markers {START} / {END} not found", file=sys.stderr)
        return 2
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    new = f"{before}{START}\n{table()}\n{END}{after}"
    if args.check:
        if new != text:
            print(f"{DOC}: quantization table is stale; run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
