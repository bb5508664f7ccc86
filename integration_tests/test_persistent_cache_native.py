"""native_cpu through the persistent compile cache: a later process restores the traced graph and
the lowered executor specs, so it neither traces nor lowers, and computes what eager computes."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, torch, torchburn
    import tb_cpu_rust.program as program
    from tb_cpu_rust.engine import NativeCpuEngine
    from torchburn import direct_inference
    if os.environ.get("FAKE_ENGINE_TAG"):  # tb-cpu-rust built for another step schema or ISA
        NativeCpuEngine.cache_tag = lambda self: os.environ["FAKE_ENGINE_TAG"]
    counts = {"traces": 0, "lowerings": 0}
    trace, lower = direct_inference.trace, program.lower
    def counted_trace(*a, **k):
        counts["traces"] += 1
        return trace(*a, **k)
    def counted_lower(*a, **k):
        counts["lowerings"] += 1
        return lower(*a, **k)
    direct_inference.trace, program.lower = counted_trace, counted_lower
    torch.manual_seed(0)
    readme = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 5),
    ).eval()
    options = {"engine": "native_cpu", "fallback": "error"}
    x = torch.randn(32, 512)
    x[0, 0] = float("nan")
    images = torch.randn(2, 6, 6, 3).permute(0, 3, 1, 2)  # channels-last: not contiguous
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(readme, backend="torchburn", options=options)(x), readme(x), equal_nan=True)
        # a second nn.Sequential in one process makes Dynamo go dynamic (symbolic graphs are
        # specialised per shape and keep only their plans on disk): start afresh
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(conv, backend="torchburn", options=options)(images), conv(images), rtol=1e-4, atol=1e-4)
    # training (AOTAutograd's forward and backward graphs): the plans come from disk as well
    train = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    reference.load_state_dict(train.state_dict())
    batch = torch.randn(8, 16)
    torch.compile(train, backend="torchburn", options=options)(batch).square().sum().backward()
    reference(batch).square().sum().backward()
    for a, b in zip(train.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    counts["fallback"] = sum(torchburn.op_coverage()["fallback"].values())
    print(json.dumps({**torchburn.cache_info(), **counts}))
    """
)


def run_process(cache_dir: pathlib.Path, **env: str) -> dict[str, Any]:
    full_env = {**os.environ, "TORCHBURN_CACHE_DIR": str(cache_dir), "TORCHBURN_ENGINE": "native_cpu", **env}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full_env, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_second_process_neither_retraces_nor_relowers(tmp_path: pathlib.Path) -> None:
    first = run_process(tmp_path)
    assert first["traces"] == 2 and first["graph_writes"] == 2
    assert first["lowerings"] >= 4 and first["disk_writes"] == first["compiles"] >= 4
    assert first["fallback"] == 0
    second = run_process(tmp_path)
    assert second["traces"] == 0 and second["graph_hits"] == 2
    assert second["lowerings"] == 0 and second["compiles"] == 0
    assert second["disk_hits"] == first["disk_writes"] and second["disk_rejected"] == 0
    assert second["fallback"] == 0


def test_stale_and_corrupt_native_entries_are_lowered_again(tmp_path: pathlib.Path) -> None:
    first = run_process(tmp_path)
    other_schema = run_process(tmp_path, FAKE_ENGINE_TAG="0+steps999")
    assert other_schema["traces"] == 2 and other_schema["graph_hits"] == 0
    assert other_schema["disk_rejected"] == first["disk_writes"] and other_schema["lowerings"] == first["lowerings"]
    # the entries are now the other schema's: back to the real one, every plan is refused and rebuilt
    back = run_process(tmp_path)
    assert back["graph_hits"] == 2 and back["disk_rejected"] == first["disk_writes"]
    plans = sorted(tmp_path.rglob("*.tbplan"))
    plans[0].write_bytes(plans[0].read_bytes()[:-7])  # truncated
    header, payload = plans[1].read_bytes().split(b"\n", 1)
    plans[1].write_bytes(header + b"\n" + payload.replace(b'"n_inputs":', b'"n_inputz":'))  # altered
    repaired = run_process(tmp_path)
    assert repaired["disk_rejected"] == 2 and repaired["lowerings"] == 2 and repaired["fallback"] == 0
    clean = run_process(tmp_path)
    assert clean["lowerings"] == 0 and clean["disk_rejected"] == 0 and clean["traces"] == 0
