"""tb-llm on the wgpu engine against tb-llm's PyTorch reference on the CPU: decode and prefill of a
random-weight Qwen2.5-0.5B-shaped checkpoint, contenders alternated (A B, B A, ...), medians.

    python benchmarks/llm_wgpu_decode.py [--quants fp32,int8,int4] [--threads 16] [--small]

Meant for a machine with a real GPU (the figures in tb-wgpu's README came from an H200 over
Vulkan); on lavapipe the "GPU" is the CPU, so it is not part of ``python -m benchmarks``.
``--small`` uses tb-llm's tiny test shape, to check the script quickly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from tb_llm import LLM
from tb_llm.testing import make_checkpoint

QWEN_0_5B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quants", default="fp32,int8,int4")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = make_checkpoint("qwen2", tempfile.mkdtemp(), **({} if args.small else QWEN_0_5B))
    prompt = "hello " * 250
    for quant in args.quants.split(","):
        llms = {
            "wgpu": LLM.from_pretrained(folder, quant=quant, engine="wgpu"),
            "reference": LLM.from_pretrained(folder, quant=quant, engine=None, device="cpu"),
        }
        rates: dict[str, list[float]] = {k: [] for k in llms}
        prefill: dict[str, list[float]] = {k: [] for k in llms}
        order = list(llms)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                llm = llms[name]
                t0 = time.perf_counter()
                llm.generate("hi", max_new_tokens=64, ignore_eos=True, temperature=0.0)
                t1 = time.perf_counter()
                llm.generate(prompt, max_new_tokens=1, ignore_eos=True, temperature=0.0)
                t2 = time.perf_counter()
                rates[name].append(64 / (t1 - t0))
                prefill[name].append(t2 - t1)
        for name in llms:  # the first round warms up
            row = {
                "quant": quant,
                "backend": name,
                "threads": args.threads,
                "decode_tok_s": statistics.median(rates[name][1:] or rates[name]),
                "prefill_s": statistics.median(prefill[name][1:] or prefill[name]),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
