"""llama.cpp on the same Qwen2.5-0.5B-shaped checkpoint as ``bench_llm.py``, for side-by-side rows.

    python benchmarks/bench_llama_cpp.py [--threads 2] [--repetitions 9]

What it does, each step cached under ``$TORCHBURN_CACHE_DIR/bench-llm`` (default ~/.cache/torchburn):

1. llama.cpp itself: ``$LLAMA_CPP_BUILD`` if set (a CMake build folder with ``bin/llama-bench`` and
   ``bin/llama-quantize``), else the llama.cpp sources vendored in the ``llama-cpp-python`` sdist
   from PyPI, built here with CMake (``-DGGML_NATIVE=ON``, Release; ~5-10 minutes on 2 cores, once).
2. The checkpoint ``bench_llm.make_model`` writes (bf16 safetensors, random weights) converted to a
   GGUF F32 file with the ``gguf`` package (tensor names and metadata of llama.cpp's ``qwen2``
   architecture; a placeholder vocabulary of the right size, since the benchmark never tokenizes),
   then ``llama-quantize`` to F16, Q8_0 and Q4_0 (the default keeps the tied output head at Q8_0),
   plus Q4_0 ``--pure`` (every tensor Q4_0).
3. ``llama-bench -fa 1 -p 512 -n 128 -t THREADS -r N -o json`` per file: prefill of 512 tokens and
   decode of 128; the rows carry the median over the ``N`` repetitions.

Each row also carries the GB/s of weights that decoding streams and the fraction of this
machine's memory read bandwidth that is (measured here with a multi-threaded sum over 1 GiB).
``run(threads)`` returns the rows; it raises ImportError (a skipped suite) when ``gguf`` or a
C++ toolchain is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# llama.cpp's quantization names -> tb-llm's matching quant (the rows the issue compares)
FORMATS: list[tuple[str, str, list[str]]] = [
    ("F32", "fp32", []),
    ("F16", "bf16", []),
    ("Q8_0", "int8", []),
    ("Q4_0", "int4", []),
    ("Q4_0-pure", "int4", ["--pure"]),
]


def cache_root() -> Path:
    """Where the llama.cpp build, the checkpoint and its GGUF files live: ``TORCHBURN_BENCH_LLM_DIR``
    (``python -m benchmarks`` sets it to the user's cache before pointing ``TORCHBURN_CACHE_DIR``
    at a fresh compile cache, so a suite run does not build llama.cpp again), else under the
    torchburn cache."""
    given = os.environ.get("TORCHBURN_BENCH_LLM_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("TORCHBURN_CACHE_DIR", Path.home() / ".cache" / "torchburn")) / "bench-llm"


# -- llama.cpp build -------------------------------------------------------------------------
def _tool(build: Path, name: str) -> Path | None:
    for candidate in (build / "bin" / name, build / name):
        if candidate.exists():
            return candidate
    return None


def llama_cpp_build() -> Path:
    """A llama.cpp build folder with llama-bench and llama-quantize, building it if needed."""
    given = os.environ.get("LLAMA_CPP_BUILD")
    if given:
        build = Path(given)
        if not (_tool(build, "llama-bench") and _tool(build, "llama-quantize")):
            raise FileNotFoundError(f"LLAMA_CPP_BUILD={given} has no bin/llama-bench and bin/llama-quantize")
        return build
    root = cache_root() / "llama.cpp"
    build = root / "build"
    if _tool(build, "llama-bench") and _tool(build, "llama-quantize"):
        return build
    cmake = shutil.which("cmake")
    if cmake is None or shutil.which("c++") is None:
        raise ImportError("building llama.cpp needs cmake and a C++ compiler (pip install cmake; apt install g++)")
    src = root / "src"
    if not (src / "CMakeLists.txt").exists():
        _fetch_sources(src)
    print(f"building llama.cpp in {build} (once; several minutes)", file=sys.stderr, flush=True)
    configure = [cmake, "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"]
    configure += [
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
    ]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    jobs = str(os.cpu_count() or 2)
    subprocess.run([cmake, "--build", str(build), "--target", "llama-bench", "llama-quantize", "-j", jobs], check=True)
    return build


def _fetch_sources(dest: Path) -> None:
    """llama.cpp as vendored in the newest llama-cpp-python sdist on PyPI (sha256-checked)."""
    import hashlib
    import urllib.parse
    import urllib.request

    index = "https://pypi.org/pypi/llama-cpp-python/json"
    with urllib.request.urlopen(index, timeout=60) as resp:
        meta = json.load(resp)
    sdist = next(u for u in meta["urls"] if u["packagetype"] == "sdist")
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / sdist["filename"]
        # a PyPI mirror may answer with URLs relative to the JSON document
        with urllib.request.urlopen(urllib.parse.urljoin(index, sdist["url"]), timeout=600) as resp:
            archive.write_bytes(resp.read())
        if hashlib.sha256(archive.read_bytes()).hexdigest() != sdist["digests"]["sha256"]:
            raise OSError(f"{sdist['filename']}: sha256 does not match PyPI's")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        vendored = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(vendored, dest)
        (dest / "SOURCE").write_text(f"{sdist['filename']} from PyPI\n")


# -- checkpoint -> GGUF ----------------------------------------------------------------------
def gguf_name(hf: str) -> str:
    """llama.cpp's tensor name for one Hugging Face Qwen2 tensor."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.{i}.<module>.<proj>.<weight|bias>
    i, rest = parts[2], ".".join(parts[3:])
    table = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    if rest not in table:
        raise KeyError(f"no llama.cpp name for {hf}")
    return f"blk.{i}.{table[rest]}"


def write_gguf_f32(folder: Path, out: Path) -> Path:
    """The safetensors checkpoint in ``folder`` as a GGUF F32 file (bf16 -> f32 is exact)."""
    try:
        import gguf
    except ImportError as exc:
        raise ImportError("the llama.cpp comparison needs the gguf package (pip install gguf)") from exc
    from tb_llm.safetensors_io import CheckpointWeights

    cfg = json.loads((folder / "config.json").read_text())
    if out.exists() and out.with_suffix(".json").exists() and json.loads(out.with_suffix(".json").read_text()) == cfg:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), "qwen2")
    writer.add_name("qwen2.5-0.5b-shape (random weights)")
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    # A placeholder SentencePiece-style vocabulary of the checkpoint's size: control tokens, the
    # 256 byte tokens, then plain pieces. llama-bench feeds random token ids and never tokenizes.
    vocab = cfg["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    tokens += [f"tok{i}" for i in range(len(tokens), vocab)]
    types += [gguf.TokenType.NORMAL] * (vocab - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    checkpoint = CheckpointWeights(folder)
    for name in checkpoint:
        writer.add_tensor(gguf_name(name), checkpoint.get(name).float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    out.with_suffix(".json").write_text(json.dumps(cfg))
    return out


def quantized(build: Path, f32: Path, fmt: str, extra: list[str], threads: int) -> Path:
    if fmt == "F32":
        return f32
    out = f32.with_name(f"model-{fmt}.gguf")
    if out.exists() and out.stat().st_mtime >= f32.stat().st_mtime:
        return out
    base = fmt.split("-")[0]
    quantize = _tool(build, "llama-quantize")
    assert quantize is not None
    tmp = out.with_suffix(".tmp")
    done = subprocess.run(
        [str(quantize), *extra, str(f32), str(tmp), base, str(threads)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize {fmt} failed:\n{done.stderr[-2000:]}")
    tmp.replace(out)
    return out


# -- measurement -----------------------------------------------------------------------------
def read_bandwidth_gb_s(threads: int, gib: float = 1.0, repeat: int = 5) -> float:
    """Memory read bandwidth: best of ``repeat`` sums over a buffer far larger than the caches."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(int(gib * 2**30) // 4)
    x.sum()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def llama_bench(
    build: Path,
    model: Path,
    threads: int,
    repetitions: int,
    prompt: int,
    new: int,
    depth: int = 0,
    extra: tuple[str, ...] = (),
) -> dict[str, float]:
    """Median tok/s of llama-bench's prefill of ``prompt`` tokens and decode of ``new`` (either
    may be 0: not run), both after ``depth`` tokens already in the cache (``-d``, untimed);
    ``extra``: more llama-bench arguments (``("--repack", "0")``)."""
    bench = _tool(build, "llama-bench")
    assert bench is not None
    cmd = [str(bench), "-m", str(model), "-t", str(threads), "-p", str(prompt), "-n", str(new)]
    cmd += ["-fa", "1", "-r", str(repetitions), "-o", "json", *extra]
    if depth:
        cmd += ["-d", str(depth)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    got: dict[str, float] = {}
    for rec in json.loads(out):
        samples = rec.get("samples_ts") or [rec["avg_ts"]]
        key = "prefill" if rec.get("n_prompt", 0) > 0 and rec.get("n_gen", 0) == 0 else "decode"
        got[key] = statistics.median(samples)
    return got


def run(
    threads: int = 2, repetitions: int = 9, prompt_tokens: int = 512, new_tokens: int = 128
) -> list[dict[str, Any]]:
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise ImportError("the llama.cpp comparison needs the gguf package (pip install gguf)") from exc
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_llm import make_model

    folder = make_model(cache_root() / "qwen2.5-0.5b-shape")
    build = llama_cpp_build()
    f32 = write_gguf_f32(folder, cache_root() / "gguf" / "model-F32.gguf")
    bandwidth = read_bandwidth_gb_s(threads)
    rows = []
    for fmt, quant, extra in FORMATS:
        path = quantized(build, f32, fmt, extra, threads)
        got = llama_bench(build, path, threads, repetitions, prompt_tokens, new_tokens)
        mb = path.stat().st_size / 1e6
        decode = got["decode"]
        rows.append(
            {
                "runtime": "llama.cpp",
                "engine": f"llama-bench -fa 1 -t {threads}",
                "quant": fmt,
                "matches": quant,
                "prompt_tokens": prompt_tokens,
                "new_tokens": new_tokens,
                "prefill_tok_s": got["prefill"],
                "decode_tok_s": decode,
                "ms_per_token": 1000.0 / decode,
                "weight_mb": mb,
                "weight_gb_s": mb / 1e3 * decode,
                "bandwidth_gb_s": bandwidth,
                "notes": f"{mb / 1e3 * decode / bandwidth:.0%} of {bandwidth:.0f} GB/s read; medians of {repetitions}",
                "threads": threads,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=9)
    args = parser.parse_args()
    for row in run(args.threads, args.repetitions):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
