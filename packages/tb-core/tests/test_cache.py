"""The structural graph cache: hits for identical structure, misses for changes, disk reuse."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import torch

import torchburn
from torchburn.cache import GraphCache, configure


def block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.addmm(b, x, w)) * x


def test_identical_layers_compile_once(toy: Any) -> None:
    # Two identical blocks separated by an op the toy engine lacks: two partitions, one compile.
    def two_layers(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h = block(x, w, b)
        h = torch.tanh(h)
        return block(h, w, b)

    args = (torch.randn(4, 4), torch.randn(4, 4), torch.randn(4))
    explanation = torchburn.explain(two_layers, *args)
    torch.testing.assert_close(explanation.output, two_layers(*args))
    statuses = [p.status for g in explanation.graphs for p in g.partitions]
    assert statuses == ["compiled", "cache hit"]
    assert len(toy.compiled_plans) == 1
    info = torchburn.cache_info()
    assert info["hits"] == 1 and info["misses"] == 1 and info["compiles"] == 1


def test_second_identical_graph_hits_and_changes_miss(toy: Any) -> None:
    args = (torch.randn(4, 4), torch.randn(4, 4), torch.randn(4))
    torch.compile(block, backend="torchburn")(*args)
    torch._dynamo.reset()
    torch.compile(block, backend="torchburn")(*args)
    assert torchburn.cache_info()["hits"] == 1
    torch._dynamo.reset()
    torch.compile(block, backend="torchburn", dynamic=False)(*(a.double() for a in args))
    assert torchburn.cache_info()["misses"] == 2  # dtype change
    torch._dynamo.reset()
    torch.compile(block, backend="torchburn", dynamic=False)(torch.randn(5, 4), args[1], args[2])
    assert torchburn.cache_info()["misses"] == 3  # shape change
    assert torchburn.cache_info()["hits"] == 1


def test_lru_eviction_keeps_the_limit(toy: Any) -> None:
    cache = configure(maxsize=2)
    for n in (2, 3, 4, 5):
        torch._dynamo.reset()
        torch.compile(block, backend="torchburn", dynamic=False)(torch.randn(n, n), torch.randn(n, n), torch.randn(n))
    assert len(cache) == 2
    assert cache.info()["evictions"] == 2


DISK_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, torchburn
    sys.path.insert(0, {tests!r})
    from conftest import ToyPlugin
    torchburn.register_plugin(ToyPlugin(), "toy-plugin")
    def block(x, w, b):
        return torch.relu(torch.addmm(b, x, w)) * x
    args = (torch.randn(4, 4), torch.randn(4, 4), torch.randn(4))
    out = torch.compile(block, backend="torchburn")(*args)
    torch.testing.assert_close(out, block(*args))
    print(json.dumps(torchburn.cache_info()))
    """
)


def run_fresh_process(cache_dir: pathlib.Path) -> dict[str, Any]:
    script = DISK_SCRIPT.format(tests=str(pathlib.Path(__file__).parent))
    env = {**__import__("os").environ, "TORCHBURN_CACHE_DIR": str(cache_dir), "TORCHBURN_LOAD_PLUGINS": "__none__"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_disk_cache_serves_a_fresh_process(tmp_path: pathlib.Path) -> None:
    first = run_fresh_process(tmp_path)
    assert first["disk_writes"] == 1 and first["disk_hits"] == 0
    second = run_fresh_process(tmp_path)
    assert second["disk_hits"] == 1 and second["compiles"] == 0


def test_corrupt_and_foreign_entries_are_rebuilt(tmp_path: pathlib.Path) -> None:
    run_fresh_process(tmp_path)
    (entry,) = list(tmp_path.rglob("*.tbplan"))
    entry.write_bytes(b"\x00garbage")
    third = run_fresh_process(tmp_path)
    assert third["disk_rejected"] == 1 and third["compiles"] == 1 and third["disk_writes"] == 1
    # a valid-looking entry from another engine version is refused too
    header, payload = entry.read_bytes().split(b"\n", 1)
    meta = json.loads(header)
    meta["engine_version"] = "9.9.9"
    entry.write_bytes(json.dumps(meta).encode() + b"\n" + payload)
    fourth = run_fresh_process(tmp_path)
    assert fourth["disk_rejected"] == 1 and fourth["compiles"] == 1
    fifth = run_fresh_process(tmp_path)
    assert fifth["disk_hits"] == 1


def test_graph_cache_unit() -> None:
    class Counting(torchburn.Engine):
        name = "counting"
        calls = 0

        def compile(self, plan: torchburn.Plan) -> Any:
            Counting.calls += 1
            return lambda *a: None

    from torchburn.plan import Plan

    cache = GraphCache(maxsize=1)
    engine = Counting()
    plan = Plan([], [], [])
    cache.get_or_compile("a", engine, plan)
    cache.get_or_compile("a", engine, plan)
    cache.get_or_compile("b", engine, plan)
    cache.get_or_compile("a", engine, plan)
    assert Counting.calls == 3
    assert cache.info()["hits"] == 1 and cache.info()["evictions"] == 2
