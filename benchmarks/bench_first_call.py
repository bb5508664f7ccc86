"""First call of the README model in a fresh process: Dynamo alone, inductor, torchburn.

    python -m benchmarks --only first_call --threads 2     (or: python benchmarks/bench_first_call.py)

Every sample is a new Python process (bytecode caches warm) that imports torch and torchburn,
compiles ``Linear(512,1024)-ReLU-Linear(1024,256)`` and calls it once on a [32, 512] batch under
``torch.no_grad()``; the child times the first call (``torch.compile`` + the call: capture,
compilation, run) and its imports. Contenders are run in alternation (A B C … A B C …) and
summarised by medians:

- ``dynamo``: ``backend="eager"`` (Dynamo's own capture, no compiler),
- ``inductor cold``: a fresh ``TORCHINDUCTOR_CACHE_DIR`` per process; ``inductor warm``: one
  folder a former process filled,
- ``torchburn off``: ``TORCHBURN_CACHE_DIR=0`` (no compile cache; nothing remembered at all,
  the wgpu adapter list included, so a wgpu probe may count),
- ``torchburn cold``: a fresh compile cache (the folder's other facts, the wgpu adapter list,
  copied from a warm one), ``torchburn warm``: the compile cache a former process filled.

Also ``torchburn engines`` wall time (a fresh process each, median): as a user runs it (the
listing remembered from the last probe, no torch import) and with ``--refresh`` (every plugin
loaded and probed, torch imported). Targets (issue 24): torchburn cold ≤ inductor warm; torchburn
warm ≤ Dynamo + 0.2 s; ``torchburn engines`` ≤ 1.5 s.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.harness import fmt_time

CHILD = """
import json, sys, time
start = time.perf_counter()
import torch
import torchburn
imported = time.perf_counter()
torch.set_num_threads(int(sys.argv[2]))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()
x = torch.randn(32, 512)
with torch.no_grad():
    begin = time.perf_counter()
    out = torch.compile(model, backend=sys.argv[1])(x)
    first = time.perf_counter() - begin
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
info = {"first_s": first, "import_s": imported - start}
if sys.argv[1] == "torchburn":
    info["cache"] = torchburn.cache_info()
    info["fallback"] = sum(torchburn.op_coverage()["fallback"].values())
print(json.dumps(info))
"""

CONTENDERS = ("dynamo", "inductor cold", "inductor warm", "torchburn off", "torchburn cold", "torchburn warm")


def _child(backend: str, threads: int, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, backend, str(threads)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"first-call child ({backend}) failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _engines_wall(env: dict[str, str], *argv: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "torchburn", "engines", *argv],
        capture_output=True,
        env={**os.environ, **env},
        timeout=300,
        check=True,
    )
    return time.perf_counter() - start


def run(threads: int, repeats: int = 5) -> list[dict[str, Any]]:
    root = tempfile.mkdtemp(prefix="tb-bench-first-call-")
    try:
        warm_tb = os.path.join(root, "torchburn-warm")
        warm_ind = os.path.join(root, "inductor-warm")
        # fill the warm caches (and torchburn's adapter list) once
        _child("torchburn", threads, {"TORCHBURN_CACHE_DIR": warm_tb})
        _child("inductor", threads, {"TORCHINDUCTOR_CACHE_DIR": warm_ind, "TORCHBURN_CACHE_DIR": warm_tb})
        samples: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
        engines: list[float] = []
        engines_probe: list[float] = []
        for i in range(repeats):
            cold_tb = os.path.join(root, f"torchburn-cold-{i}")
            shutil.copytree(warm_tb, cold_tb, ignore=shutil.ignore_patterns("compile"))
            envs = {
                "dynamo": ("eager", {"TORCHBURN_CACHE_DIR": warm_tb}),
                "inductor cold": (
                    "inductor",
                    {
                        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, f"inductor-cold-{i}"),
                        "TORCHBURN_CACHE_DIR": warm_tb,
                    },
                ),
                "inductor warm": ("inductor", {"TORCHINDUCTOR_CACHE_DIR": warm_ind, "TORCHBURN_CACHE_DIR": warm_tb}),
                "torchburn off": ("torchburn", {"TORCHBURN_CACHE_DIR": "0"}),
                "torchburn cold": ("torchburn", {"TORCHBURN_CACHE_DIR": cold_tb}),
                "torchburn warm": ("torchburn", {"TORCHBURN_CACHE_DIR": warm_tb}),
            }
            for name in CONTENDERS:
                backend, env = envs[name]
                samples[name].append(_child(backend, threads, env))
            engines_probe.append(_engines_wall({"TORCHBURN_CACHE_DIR": warm_tb}, "--refresh"))
            engines.append(_engines_wall({"TORCHBURN_CACHE_DIR": warm_tb}))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first = {c: statistics.median(s["first_s"] for s in samples[c]) for c in CONTENDERS}
    imports = {c: statistics.median(s["import_s"] for s in samples[c]) for c in CONTENDERS}
    # a warm process that missed: its sources changed meanwhile (an edited checkout), say
    hits = sum(s["cache"]["graph_hits"] == 1 and s["cache"]["compiles"] == 0 for s in samples["torchburn warm"])
    warm_hits = f"{hits}/{len(samples['torchburn warm'])}"
    fallback = max(s["fallback"] for c in CONTENDERS if c.startswith("torchburn") for s in samples[c])
    engines_s = statistics.median(engines)
    engines_probe_s = statistics.median(engines_probe)
    rows = []
    for c in CONTENDERS:
        rows.append(
            {
                "suite": "first_call",
                "first_call": True,
                "name": c,
                "threads": threads,
                "engines": "native_cpu" if c.startswith("torchburn") else "-",
                "first_s": first[c],
                "import_s": imports[c],
                "samples": len(samples[c]),
                "notes": "",
            }
        )
    rows[0]["engines_cli_s"] = engines_s
    rows[0]["engines_probe_s"] = engines_probe_s
    rows[0]["warm_hits"] = warm_hits
    rows[0]["fallback"] = fallback
    rows[0]["targets"] = {
        "torchburn cold <= inductor warm": first["torchburn cold"] <= first["inductor warm"],
        "torchburn warm <= dynamo + 0.2 s": first["torchburn warm"] <= first["dynamo"] + 0.2,
        "torchburn engines <= 1.5 s": engines_s <= 1.5,
    }
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    """The page's "First call" section (``python -m benchmarks`` calls it)."""
    if not rows:
        return []
    head = rows[0]
    threads = head.get("threads", "-")
    lines = [
        "",
        "## First call in a fresh process",
        "",
        "The README model's first call (`torch.compile` + one call: Dynamo's first import and capture,",
        f"compile, run) in a new Python process, medians of {head.get('samples', '-')} processes per contender run",
        f"in alternation ({threads} thread{'' if threads == 1 else 's'}); the imports of torch and torchburn before it are",
        "timed apart. Cold / warm: a fresh or a filled compile cache (torchburn's persistent cache,",
        'docs/architecture.md "Compile caches"; inductor\'s `TORCHINDUCTOR_CACHE_DIR`); torchburn off:',
        "`TORCHBURN_CACHE_DIR=0`, which also forgets the wgpu adapter list (a device probe in each process).",
        "Targets: torchburn cold ≤ inductor warm; torchburn warm ≤ Dynamo alone + 0.2 s; `torchburn engines` ≤ 1.5 s.",
        "",
        "| contender | first call | imports |",
        "| --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {fmt_time(r.get('first_s'))} | {fmt_time(r.get('import_s'))} |")
    targets = head.get("targets", {})
    lines += [
        "",
        f"`torchburn engines`: {fmt_time(head.get('engines_cli_s'))} (a fresh process, median; the listing "
        f"remembered from the last probe), {fmt_time(head.get('engines_probe_s'))} with `--refresh` "
        "(every plugin loaded and probed). "
        + (
            f"Warm torchburn processes that restored their graph and plan from disk: {head['warm_hits']}; "
            if head.get("warm_hits")
            else ""
        )
        + f"Fallback ops in the torchburn processes: {head.get('fallback')}.",
        "Targets met: " + "; ".join(f"{k}: {'yes' if v else 'no'}" for k, v in targets.items()) + ".",
    ]
    return lines


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result = run(args.threads, args.repeats)
    for row in result:
        print(json.dumps(row))
    print("\n".join(render(result)))
