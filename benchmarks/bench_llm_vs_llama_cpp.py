"""tb-llm against llama.cpp, interleaved: the two runtimes take turns on one weight format.

    python benchmarks/bench_llm_vs_llama_cpp.py [--threads 2] [--rounds 5] [--quant bf16 ...]

``bench_llm.py`` and ``bench_llama_cpp.py`` each measure their runtime over every format, one
after the other, minutes apart. On a shared machine whose speed drifts over minutes, a 10 %
difference between those rows can be the machine. This suite pairs them instead: for each
format (tb-llm fp32 / bf16 / int8 / int4 against llama.cpp F32 / F16 / Q8_0 / Q4_0), every
round runs ``llama-bench -r 1`` (prefill of 512 tokens, decode of 128, flash attention on) and
then tb-llm's prefill of the same 512-token length and decode of 128 tokens from a 1-token
prompt, A B A B ... Then both decode 128 tokens again with 512 tokens already in the cache
(llama-bench ``-p 0 -n 128 -d 512``; tb-llm: a 512-token prompt, decode timed on its own): a
chat's later turns, where attention over the cache is part of every step. The row carries the
medians over the rounds and the ratio of the medians (> 1: tb-llm faster), with the per-round
ratios' range.

Same checkpoint, same llama.cpp build and GGUF files as ``bench_llama_cpp.py`` (cached under
``$TORCHBURN_CACHE_DIR/bench-llm``). ``run(threads)`` returns the rows; ImportError (a skipped
suite) when ``gguf``, a C++ toolchain or tb-llm is missing.

    python benchmarks/bench_llm_vs_llama_cpp.py --smollm2 [--threads 2] [--rounds 7] [--quant int4 ...]

``--smollm2`` (or ``--gguf FILE``): a real checkpoint instead, both runtimes reading the same
GGUF file: SmolLM2-135M-Instruct's Q4_1 file (``tb_llm.testing.smollm2_gguf``) against tb-llm's
int4 loaded from it, and llama.cpp's own requantizations of that file (F32, F16, Q8_0, made once
with ``llama-quantize --allow-requantize`` beside it) against fp32 / bf16 / int8 loaded from the
Q4_1 file. The order alternates per round (llama.cpp first, then tb-llm first: A B B A ...), and
llama-bench runs with ``--repack 0`` (its AMX repacked path segfaulted on one VM that advertises
AMX). A small model decodes in milliseconds, so this is where tb-llm's per-token Python shows
(``bench_llm_token_overhead.py`` measures it alone).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# tb-llm quant -> llama.cpp format it is held against (llama.cpp's default Q4_0 mix)
PAIRS: tuple[tuple[str, str], ...] = (("fp32", "F32"), ("bf16", "F16"), ("int8", "Q8_0"), ("int4", "Q4_0"))


def run(
    threads: int = 2,
    rounds: int = 5,
    prompt_tokens: int = 512,
    new_tokens: int = 128,
    quants: tuple[str, ...] = ("fp32", "bf16", "int8", "int4"),
    depth: int = 512,
    bench_args: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    try:
        import gguf  # noqa: F401

        import tb_llm  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"the head-to-head needs gguf and tb-llm ({exc})") from exc
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_llama_cpp import FORMATS, cache_root, llama_bench, llama_cpp_build, quantized, write_gguf_f32
    from benchmarks.bench_llm import make_model
    from tb_llm import LLM

    torch.set_num_threads(threads)
    folder = make_model(cache_root() / "qwen2.5-0.5b-shape")
    build = llama_cpp_build()
    f32 = write_gguf_f32(folder, cache_root() / "gguf" / "model-F32.gguf")
    extra = {fmt: args for fmt, _, args in FORMATS}
    rows: list[dict[str, Any]] = []
    for quant, fmt in PAIRS:
        if quant not in quants:
            continue
        path = quantized(build, f32, fmt, extra[fmt], threads)
        llm = LLM.from_pretrained(folder, quant=quant, device="cpu")
        gen = torch.Generator().manual_seed(0)
        vocab = llm.config.vocab_size
        prompt = torch.randint(0, vocab, (prompt_tokens,), generator=gen).tolist()
        short = torch.randint(0, vocab, (1,), generator=gen).tolist()
        llm.generate(prompt, max_new_tokens=1, ignore_eos=True)  # warm-up (llama-bench warms up too)
        deep = torch.randint(0, vocab, (depth,), generator=gen).tolist()
        got: dict[str, list[float]] = {k: [] for k in ("cpp_prefill", "cpp_decode", "tb_prefill", "tb_decode")}
        if depth:
            got.update({"cpp_decode_deep": [], "tb_decode_deep": []})
        for _ in range(rounds):
            cpp = llama_bench(build, path, threads, 1, prompt_tokens, new_tokens, extra=bench_args)
            got["cpp_prefill"].append(cpp["prefill"])
            got["cpp_decode"].append(cpp["decode"])
            got["tb_prefill"].append(llm.generate(prompt, max_new_tokens=1, ignore_eos=True).timing.prefill_tok_s)
            got["tb_decode"].append(llm.generate(short, max_new_tokens=new_tokens, ignore_eos=True).timing.decode_tok_s)
            if depth:
                deep_cpp = llama_bench(build, path, threads, 1, 0, new_tokens, depth, extra=bench_args)
                got["cpp_decode_deep"].append(deep_cpp["decode"])
                tb = llm.generate(deep, max_new_tokens=new_tokens, ignore_eos=True)
                got["tb_decode_deep"].append(tb.timing.decode_tok_s)
        del llm
        gc.collect()
        med = {k: statistics.median(v) for k, v in got.items()}
        row: dict[str, Any] = {
            "head_to_head": True,
            "quant": quant,
            "matches": fmt,
            "threads": threads,
            "rounds": rounds,
            "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens,
            "depth": depth,
            **med,
            "samples": got,
        }
        for what in ("prefill", "decode", "decode_deep")[: 3 if depth else 2]:
            per_round = [t / c for t, c in zip(got[f"tb_{what}"], got[f"cpp_{what}"])]
            row[f"{what}_ratio"] = med[f"tb_{what}"] / med[f"cpp_{what}"]
            row[f"{what}_ratio_range"] = (min(per_round), max(per_round))
        rows.append(row)
        print(_fmt(row), flush=True)
    return rows


# tb-llm quant -> the llama.cpp file it is held against, for one GGUF checkpoint (None: the file itself)
GGUF_PAIRS: tuple[tuple[str, str | None], ...] = (("int4", None), ("int8", "Q8_0"), ("bf16", "F16"), ("fp32", "F32"))


def run_gguf(
    gguf_path: Path | None = None,
    threads: int = 2,
    rounds: int = 7,
    prompt_tokens: int = 512,
    new_tokens: int = 128,
    quants: tuple[str, ...] = ("int4", "fp32"),
    extra: tuple[str, ...] = ("--repack", "0"),
) -> list[dict[str, Any]]:
    """The head-to-head on one GGUF checkpoint (default: SmolLM2-135M-Instruct Q4_1), both
    runtimes reading the same file (see the module)."""
    import subprocess

    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_llama_cpp import _tool, llama_cpp_build
    from tb_llm import LLM
    from tb_llm.testing import smollm2_gguf

    torch.set_num_threads(threads)
    path = Path(gguf_path) if gguf_path is not None else smollm2_gguf()
    build = llama_cpp_build()
    rows: list[dict[str, Any]] = []
    for quant, fmt in GGUF_PAIRS:
        if quant not in quants:
            continue
        cpp_file = path
        if fmt is not None:
            cpp_file = path.with_name(f"{path.stem}.requant-{fmt}.gguf")
            if not cpp_file.exists():
                quantize = _tool(build, "llama-quantize")
                assert quantize is not None
                cmd = [str(quantize), "--allow-requantize", str(path), str(cpp_file), fmt]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        llm = LLM.from_pretrained(path, quant=quant, device="cpu")
        got = _alternate(llm, build, cpp_file, threads, rounds, prompt_tokens, new_tokens, extra)
        del llm
        gc.collect()
        med = {k: statistics.median(v) for k, v in got.items()}
        row: dict[str, Any] = {
            "head_to_head": True,
            "checkpoint": path.name,
            "quant": quant,
            "matches": f"{fmt} (requantized)" if fmt is not None else f"{path.stem.rsplit('.', 1)[-1]} (the file)",
            "threads": threads,
            "rounds": rounds,
            "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens,
            "depth": 0,
            "llama_bench_extra": list(extra),
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            **med,
            "samples": got,
        }
        for what in ("prefill", "decode"):
            per_round = [t / c for t, c in zip(got[f"tb_{what}"], got[f"cpp_{what}"])]
            row[f"{what}_ratio"] = med[f"tb_{what}"] / med[f"cpp_{what}"]
            row[f"{what}_ratio_range"] = (min(per_round), max(per_round))
        rows.append(row)
        print(_fmt(row), flush=True)
    return rows


def _alternate(
    llm: Any,
    build: Path,
    cpp_file: Path,
    threads: int,
    rounds: int,
    prompt_tokens: int,
    new_tokens: int,
    extra: tuple[str, ...],
) -> dict[str, list[float]]:
    """``rounds`` of llama-bench and tb-llm, llama.cpp first in even rounds, tb-llm first in odd ones."""
    import torch

    from benchmarks.bench_llama_cpp import llama_bench

    gen = torch.Generator().manual_seed(0)
    vocab = llm.config.vocab_size
    prompt = torch.randint(0, vocab, (prompt_tokens,), generator=gen).tolist()
    short = torch.randint(0, vocab, (1,), generator=gen).tolist()
    llm.generate(prompt, max_new_tokens=1, ignore_eos=True)  # warm-up (llama-bench warms up too)
    got: dict[str, list[float]] = {k: [] for k in ("cpp_prefill", "cpp_decode", "tb_prefill", "tb_decode")}

    def cpp() -> None:
        out = llama_bench(build, cpp_file, threads, 1, prompt_tokens, new_tokens, extra=extra)
        got["cpp_prefill"].append(out["prefill"])
        got["cpp_decode"].append(out["decode"])

    def tb() -> None:
        got["tb_prefill"].append(llm.generate(prompt, max_new_tokens=1, ignore_eos=True).timing.prefill_tok_s)
        got["tb_decode"].append(llm.generate(short, max_new_tokens=new_tokens, ignore_eos=True).timing.decode_tok_s)

    for i in range(rounds):
        for step in (cpp, tb) if i % 2 == 0 else (tb, cpp):
            step()
    return got


def _fmt(r: dict[str, Any]) -> str:
    return (
        f"tb-llm {r['quant']:5s} vs llama.cpp {r['matches']:5s}: prefill {r['tb_prefill']:7.1f} vs {r['cpp_prefill']:7.1f} "
        f"tok/s ({r['prefill_ratio']:.2f}x), decode {r['tb_decode']:6.2f} vs {r['cpp_decode']:6.2f} tok/s "
        f"({r['decode_ratio']:.2f}x)"
        + (
            f", decode at depth {r['depth']} {r['tb_decode_deep']:6.2f} vs {r['cpp_decode_deep']:6.2f} tok/s "
            f"({r['decode_deep_ratio']:.2f}x)"
            if r.get("depth")
            else ""
        )
        + f", {r['rounds']} rounds"
    )


def render(rows: list[dict[str, Any]]) -> list[str]:
    """The docs section for these rows (used by ``python -m benchmarks``)."""
    if not rows:
        return []
    first = rows[0]
    lines = [
        "",
        "## tb-llm against llama.cpp, interleaved",
        "",
        f"Each round runs `llama-bench -fa 1 -r 1 -p {first['prompt_tokens']} -n {first['new_tokens']} -t {first['threads']}` "
        f"and then tb-llm's prefill of {first['prompt_tokens']} tokens and decode of {first['new_tokens']} "
        + ("(A B B A ..., the order alternating per round" if first.get("checkpoint") else "(A B A B ...")
        + "); medians over the rounds, ratio = tb-llm ÷ llama.cpp (> 1: tb-llm faster), "
        "with the lowest and highest per-round ratio. "
        + (
            f"Decode at depth: the same decode with {first['depth']} tokens already in the cache "
            '(llama-bench `-d`); "-" where not measured.'
            if first.get("depth")
            else ""
        ),
        "",
        "| tb-llm | llama.cpp | threads | rounds | prefill tok/s (tb / llama.cpp) | prefill ratio [range] "
        "| decode tok/s (tb / llama.cpp) | decode ratio [range] | decode at depth (tb / llama.cpp) | ratio [range] |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        pr, dr = r["prefill_ratio_range"], r["decode_ratio_range"]
        deep = "- | -"
        if r.get("depth"):
            xr = r["decode_deep_ratio_range"]
            deep = (
                f"{r['tb_decode_deep']:.2f} / {r['cpp_decode_deep']:.2f} | "
                f"{r['decode_deep_ratio']:.2f}× [{xr[0]:.2f}–{xr[1]:.2f}]"
            )
        lines.append(
            f"| {r['quant']} | {r['matches']} | {r['threads']} | {r['rounds']} | "
            f"{r['tb_prefill']:.1f} / {r['cpp_prefill']:.1f} | {r['prefill_ratio']:.2f}× [{pr[0]:.2f}–{pr[1]:.2f}] | "
            f"{r['tb_decode']:.2f} / {r['cpp_decode']:.2f} | {r['decode_ratio']:.2f}× [{dr[0]:.2f}–{dr[1]:.2f}] | "
            f"{deep} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--quant", action="append", choices=[q for q, _ in PAIRS])
    parser.add_argument("--depth", type=int, default=512, help="cached tokens for the second decode (0: skip)")
    parser.add_argument(
        "--no-repack",
        action="store_true",
        help="llama-bench --repack 0 (its AMX repacked path dies with SIGILL / SIGSEGV on VMs that advertise AMX "
        "without enabling it); always on with --smollm2 / --gguf",
    )
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M's GGUF file in both runtimes")
    parser.add_argument("--gguf", type=Path, default=None, help="this GGUF file in both runtimes")
    args = parser.parse_args()
    if args.smollm2 or args.gguf is not None:
        quants = tuple(args.quant) if args.quant else ("int4", "fp32")
        rows = run_gguf(args.gguf, args.threads, args.rounds, args.prompt_tokens, args.new_tokens, quants)
    else:
        quants = tuple(args.quant) if args.quant else tuple(q for q, _ in PAIRS)
        extra = ("--repack", "0") if args.no_repack else ()
        rows = run(args.threads, args.rounds, args.prompt_tokens, args.new_tokens, quants, args.depth, extra)
    print("\n".join(render(rows)))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
