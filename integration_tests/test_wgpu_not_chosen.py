"""With native_cpu installed beside tb-wgpu, compiling on the default engines opens no wgpu device,
and imports no part of inductor that Dynamo's own capture does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

CODE = """
    import json, sys, torch, torchburn

    def inductor():
        return {m for m in sys.modules if m.startswith("torch._inductor")}

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(model, backend="eager")(x)  # what Dynamo itself imports
        dynamo = inductor()
        torch._dynamo.reset()
        torchburn.reset_stats()
        out = torch.compile(model, backend="torchburn")(x)
        torch.testing.assert_close(out, model(x))
    from tb_wgpu import device
    print(json.dumps({"in_force": torchburn.active_engines(), "device_opened": device._CONTEXT is not None,
                      "fallback": torchburn.op_coverage()["fallback"], "inductor": sorted(inductor() - dynamo)}))
"""


def test_default_compile_on_native_cpu_opens_no_wgpu_device(tmp_path: Path) -> None:
    env = {**os.environ, "TORCHBURN_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CODE)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["in_force"][0] == "native_cpu" and "wgpu" in got["in_force"], got
    assert not got["device_opened"], got
    assert got["fallback"] == {}, got  # native_cpu took the whole model
    # make_fx itself (torch's tracer, not ours) imports this one pass module
    assert set(got["inductor"]) <= {"torch._inductor.fx_passes", "torch._inductor.fx_passes.dedupe_symint_uses"}, got
