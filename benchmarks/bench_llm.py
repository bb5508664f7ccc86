"""tb-llm speed on a Qwen2.5-0.5B-shaped model against transformers, in the same run.

    python benchmarks/bench_llm.py [--threads 2] [--prompt-tokens 512] [--new-tokens 128]

Prefill is timed on a ``--prompt-tokens`` prompt; decode generates ``--new-tokens`` from a
1-token prompt, as llama-bench's ``-p 512 -n 128`` (pp512 / tg128) rows do, so the rows compare
with ``bench_llama_cpp.py``'s.

The model has Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads, intermediate
4864, vocab 151936, tied embeddings) and random weights, written as bf16 safetensors by this
script (speed does not depend on the values). ``run(threads)`` returns one dict per row.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}


def make_model(folder: Path) -> Path:
    """Random bf16 weights in safetensors (once; reused while the config is unchanged)."""
    from tb_llm.config import parse_config
    from tb_llm.model import expected_shapes
    from tb_llm.safetensors_io import save_file

    stamp = folder / "config.json"
    if stamp.exists() and json.loads(stamp.read_text()) == CONFIG and (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in expected_shapes(parse_config(CONFIG)).items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
    save_file(tensors, folder / "model.safetensors")
    stamp.write_text(json.dumps(CONFIG, indent=1))
    return folder


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:
        return float("nan")


def bench_tb_llm(folder: Path, quant: str, prompt_tokens: int, new_tokens: int, repeat: int) -> dict[str, Any]:
    from tb_llm import LLM
    from tb_llm.bench import benchmark

    gc.collect()
    base = _rss_mb()
    start = time.perf_counter()
    llm = LLM.from_pretrained(folder, quant=quant, device="cpu")
    r = benchmark(llm, prompt_tokens=prompt_tokens, new_tokens=new_tokens, repeat=repeat, first_token_from=start)
    r["rss_mb"] = _rss_mb() - base
    r["runtime"] = "tb-llm"
    r["weight_gb_s"] = r["weight_mb"] / 1e3 * r["decode_tok_s"]
    del llm
    gc.collect()
    r.update(cold_start(folder, quant, torch.get_num_threads()))
    resident, budget = r["cold_resident_mb"], r["weight_mb"] + r["cold_kv_mb"]
    r["notes"] = (
        f"fresh process: first token {r['cold_first_token_s']:.2f} s after from_pretrained "
        f"({COLD_PROMPT}-token prompt), resident {resident:.0f} MB = {resident / budget:.2f}x (weights + KV)"
    )
    return r


COLD_PROMPT = 16


def cold_start(folder: Path, quant: str, threads: int) -> dict[str, float]:
    """Time to the first token and resident memory, in a fresh process (nothing cached or warm).

    The child measures its RSS after importing torch and tb_llm (the baseline), then
    ``from_pretrained`` + one token from a short prompt; resident = RSS then - baseline.
    """
    import subprocess

    out = subprocess.run(
        [sys.executable, __file__, "--cold", str(folder), quant, str(threads)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _cold_child(folder: str, quant: str, threads: int) -> None:
    torch.set_num_threads(threads)
    import tb_llm

    base = _rss_mb()
    start = time.perf_counter()
    llm = tb_llm.LLM.from_pretrained(folder, quant=quant, device="cpu")
    prompt = torch.randint(0, CONFIG["vocab_size"], (COLD_PROMPT,), generator=torch.Generator().manual_seed(1))
    llm.generate(prompt.tolist(), max_new_tokens=1, ignore_eos=True)
    first = time.perf_counter() - start
    gc.collect()
    kv = llm._last_cache.nbytes() / 1e6
    print(json.dumps({"cold_first_token_s": first, "cold_resident_mb": _rss_mb() - base, "cold_kv_mb": kv}))


def bench_transformers(
    folder: Path, dtype: torch.dtype, prompt_tokens: int, new_tokens: int, repeat: int
) -> dict[str, Any]:
    import transformers

    transformers.logging.set_verbosity_error()
    gc.collect()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.eval()
    ids = torch.randint(0, CONFIG["vocab_size"], (1, prompt_tokens), generator=torch.Generator().manual_seed(0))
    pre, dec = [], []
    with torch.inference_mode():
        model(ids[:, :8])  # warm-up
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t1 = time.perf_counter()
            past = out.past_key_values
            for _ in range(new_tokens - 1):
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t2 = time.perf_counter()
            pre.append(prompt_tokens / (t1 - t0))
            dec.append((new_tokens - 1) / (t2 - t1))
    weight_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    del model
    gc.collect()
    decode = statistics.median(dec)
    return {
        "runtime": "transformers",
        "engine": "eager",
        "quant": "bf16" if dtype == torch.bfloat16 else "fp32",
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "prefill_tok_s": statistics.median(pre),
        "decode_tok_s": decode,
        "ms_per_token": 1000.0 / decode,
        "weight_mb": weight_mb,
        "weight_gb_s": weight_mb / 1e3 * decode,
    }


def run(
    threads: int = 2,
    prompt_tokens: int = 512,
    new_tokens: int = 128,
    repeat: int = 2,
    quants: tuple[str, ...] = ("fp32", "bf16", "int8", "int4"),
    transformers_baseline: bool = True,
) -> list[dict[str, Any]]:
    torch.set_num_threads(threads)
    cache = (
        Path(os.environ.get("TORCHBURN_CACHE_DIR", Path.home() / ".cache" / "torchburn"))
        / "bench-llm"
        / "qwen2.5-0.5b-shape"
    )
    folder = make_model(cache)
    rows: list[dict[str, Any]] = []
    # Each transformers row runs right after the tb-llm row of the same dtype, so the pairs that
    # are compared see the same machine load.
    hf_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for quant in quants:
        rows.append(_note_load(bench_tb_llm(folder, quant, prompt_tokens, new_tokens, repeat)))
        print(_fmt(rows[-1]), flush=True)
        if transformers_baseline and quant in hf_dtypes:
            try:
                rows.append(_note_load(bench_transformers(folder, hf_dtypes[quant], prompt_tokens, new_tokens, repeat)))
                print(_fmt(rows[-1]), flush=True)
            except ImportError:
                transformers_baseline = False
    for r in rows:
        r["threads"] = threads
    return rows


def _note_load(row: dict[str, Any]) -> dict[str, Any]:
    # Other work on the machine skews every figure; record the 1-minute load average with each row.
    row["loadavg"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return row


def _fmt(r: dict[str, Any]) -> str:
    extra = (
        f" load {r['load_s']:.2f}s first-token {r['first_token_s']:.2f}s rss +{r['rss_mb']:.0f}MB"
        if "load_s" in r
        else ""
    )
    return (
        f"{r['runtime']:12s} {r['quant']:5s} prefill {r['prefill_tok_s']:8.1f} tok/s  decode {r['decode_tok_s']:6.1f} tok/s "
        f"({r['ms_per_token']:6.1f} ms/tok)  weights {r['weight_mb']:7.1f} MB ({r['weight_gb_s']:.1f} GB/s){extra}"
    )


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    """The docs table: one row per runtime x quantization, same run, same machine."""
    import platform

    lines = [
        f"Measured with `{command}` ({rows[0]['threads']} threads, {platform.machine()}, "
        f"torch {torch.__version__}; prefill of a {rows[0]['prompt_tokens']}-token prompt, decode of "
        f"{rows[0]['new_tokens']} tokens from a {rows[0].get('decode_context', 1)}-token prompt (as llama-bench's "
        "pp512 / tg128), median of the runs):",
        "",
        "| runtime | weights | prefill tok/s | decode tok/s | ms/token | weight MB | weight GB/s in decode | load s | first token s | load avg |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        load = f"{r['load_s']:.2f}" if "load_s" in r else "-"
        first = f"{r['first_token_s']:.2f}" if "first_token_s" in r else "-"
        lines.append(
            f"| {r['runtime']} ({r['engine']}) | {r['quant']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | "
            f"{r['ms_per_token']:.1f} | {r['weight_mb']:.0f} | {r['weight_gb_s']:.1f} | {load} | {first} | {_load(r)} |"
        )
    return "\n".join(lines)


def _load(row: dict[str, Any]) -> str:
    value = row.get("loadavg")
    return "-" if value is None or value != value else f"{value:.1f}"


def write_docs(rows: list[dict[str, Any]], command: str) -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "llm.md"
    start, end = "<!-- bench-llm:start -->", "<!-- bench-llm:end -->"
    text = doc.read_text(encoding="utf-8")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    doc.write_text(f"{before}{start}\n{markdown(rows, command)}\n{end}{after}", encoding="utf-8")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--cold":
        _cold_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--quant", action="append", choices=["fp32", "bf16", "int8", "int4"])
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--from-json", type=Path, default=None, help="skip measuring: format rows saved by --json")
    ap.add_argument(
        "--write-docs", metavar="COMMAND", default=None, help="put the table in docs/llm.md, citing COMMAND"
    )
    a = ap.parse_args()
    if a.from_json:
        rows = json.loads(a.from_json.read_text())
        if a.write_docs:
            write_docs(rows, a.write_docs)
        print(markdown(rows, a.write_docs or "benchmarks/bench_llm.py"))
        return
    rows = run(
        a.threads,
        a.prompt_tokens,
        a.new_tokens,
        a.repeat,
        tuple(a.quant or ("fp32", "bf16", "int8", "int4")),
        not a.no_transformers,
    )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    if a.write_docs:
        write_docs(rows, a.write_docs)


if __name__ == "__main__":
    main()
