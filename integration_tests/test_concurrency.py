"""Threads sharing one compiled model; processes sharing one disk cache."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import ENGINES

from torchburn.testing.models import readme_mlp


@pytest.mark.parametrize("engine", ENGINES)
def test_eight_threads_one_compiled_model(engine: str) -> None:
    model, (x,) = readme_mlp(batch=8)
    compiled = torch.compile(model, backend="torchburn", options={"engine": engine})
    inputs = [torch.randn(8, 512, generator=torch.Generator().manual_seed(i)) for i in range(32)]
    with torch.no_grad():
        compiled(x)  # compile once before the threads start
        expected = [model(xi) for xi in inputs]

        def work(i: int) -> torch.Tensor:
            return compiled(inputs[i])

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(work, range(32)))
    for got, want in zip(results, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


WRITER = textwrap.dedent(
    """
    import json, sys, torch, torchburn
    torch.manual_seed(int(sys.argv[1]))
    for width in (8, 16, 24, 32):
        m = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
        x = torch.randn(3, width)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(m, backend="torchburn", options={"engine": sys.argv[2]})(x), m(x), rtol=1e-4, atol=1e-4)
        torch._dynamo.reset()
    print(json.dumps(torchburn.cache_info()))
    """
)


@pytest.mark.parametrize("engine", ENGINES)
def test_two_processes_fill_one_disk_cache(engine: str, tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "TORCHBURN_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(i), engine],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    entries = list(tmp_path.rglob("*.tbplan"))
    assert not list(tmp_path.rglob(".tmp-*")), "a temporary file was left behind"
    # a third process must find every entry valid (no torn or corrupt file)
    out = subprocess.run(
        [sys.executable, "-c", WRITER, "2", engine], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["disk_rejected"] == 0
    if entries:  # engines that persist plans must serve the third process from disk
        assert info["disk_hits"] >= 1 and info["compiles"] == 0
