"""The persistent compile cache: traced graphs and engine plans reused by a later process,
keyed safely, checked, concurrent-safe, bounded, and off with ``TORCHBURN_CACHE_DIR=0``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

import torchburn
from torchburn import backend, direct_inference
from torchburn.cache import (
    GraphCache,
    compile_cache_dir,
    configure,
    graph_from_json,
    graph_to_json,
    traced_graph_key,
    user_cache_dir,
)
from torchburn.options import Options
from torchburn.plan import PlanError

# A fresh process compiling one function on the toy engine; it counts the traces and the
# engine compiles, checks the result against eager, and prints what happened as JSON.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, torch, torchburn
    sys.path.insert(0, {tests!r})
    from conftest import ToyEngine, ToyPlugin
    from torchburn import backend, direct_inference
    if os.environ.get("FAKE_TORCH_VERSION"):
        torch.__version__ = os.environ["FAKE_TORCH_VERSION"]
    if os.environ.get("FAKE_ENGINE_VERSION"):
        ToyEngine.version = lambda self: os.environ["FAKE_ENGINE_VERSION"]
    if os.environ.get("FAKE_ENGINE_TAG"):  # an engine built for another ISA or step schema, say
        ToyEngine.cache_tag = lambda self: os.environ["FAKE_ENGINE_TAG"]
    counts = {{"traces": 0, "decompositions": 0}}
    trace = direct_inference.trace
    def counted_trace(*a, **k):
        counts["traces"] += 1
        return trace(*a, **k)
    direct_inference.trace = counted_trace
    table = backend.decomposition_table
    def counted_table():
        counts["decompositions"] += 1
        return table()
    backend.decomposition_table = counted_table
    torchburn.register_plugin(ToyPlugin(), "toy-plugin")
    def block(x, w, b):
        y = torch.relu(torch.addmm(b, x, w)) * x
        return y, y.permute(1, 0) + 1.0
    torch.manual_seed(0)
    args = (torch.randn(6, 6), torch.randn(6, 6), torch.randn(6))
    args[0][0, 0] = float("nan")
    with torch.no_grad():
        out = torch.compile(block, backend="torchburn")(*args)
    torch.testing.assert_close(out, block(*args), equal_nan=True)
    counts["engine_compiles"] = len(ToyEngine.compiled_plans)
    counts["fallback"] = sum(torchburn.op_coverage()["fallback"].values())
    print(json.dumps({{**torchburn.cache_info(), **counts}}))
    """
)


def run_process(cache_dir: Any, **env: str) -> dict[str, Any]:
    script = SCRIPT.format(tests=str(pathlib.Path(__file__).parent))
    full_env = {**os.environ, "TORCHBURN_CACHE_DIR": str(cache_dir), "TORCHBURN_LOAD_PLUGINS": "__none__", **env}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=full_env, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def entries(folder: pathlib.Path, suffix: str) -> list[pathlib.Path]:
    return sorted(folder.rglob(f"*.{suffix}"))


def test_a_second_process_neither_retraces_nor_recompiles(tmp_path: pathlib.Path) -> None:
    first = run_process(tmp_path)
    assert first["traces"] == 1 and first["graph_writes"] == 1 and first["disk_writes"] == 1
    assert first["fallback"] == 0
    assert len(entries(tmp_path / "compile", "tbgraph")) == 1
    second = run_process(tmp_path)
    # no decomposition table, no trace: the ATen graph came from disk, and so did the plan
    assert second["traces"] == 0 and second["decompositions"] == 0
    assert second["graph_hits"] == 1 and second["disk_hits"] == 1 and second["compiles"] == 0
    assert second["graph_writes"] == 0 and second["fallback"] == 0


def test_a_stale_entry_after_a_version_change_is_not_used(tmp_path: pathlib.Path) -> None:
    run_process(tmp_path)
    torch_changed = run_process(tmp_path, FAKE_TORCH_VERSION="99.0.0")
    assert torch_changed["graph_hits"] == 0 and torch_changed["traces"] == 1
    # the plan key holds torch's version as well: compiled again, stored beside the old one
    assert torch_changed["disk_hits"] == 0 and torch_changed["compiles"] == 1
    engine_changed = run_process(tmp_path, FAKE_ENGINE_VERSION="9.9.9")
    assert engine_changed["graph_hits"] == 0 and engine_changed["traces"] == 1
    assert engine_changed["compiles"] == 1 and engine_changed["disk_hits"] == 0
    # same version, another cache tag: the plan's file is found under the same key and refused
    tag_changed = run_process(tmp_path, FAKE_ENGINE_TAG="0.1.0+other-isa")
    assert tag_changed["graph_hits"] == 0 and tag_changed["traces"] == 1
    assert tag_changed["disk_rejected"] == 1 and tag_changed["compiles"] == 1 and tag_changed["disk_writes"] == 1
    # the old versions' entries still serve the original process
    again = run_process(tmp_path)
    assert again["graph_hits"] == 1 and again["traces"] == 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "payload"])
def test_a_corrupt_graph_entry_is_rebuilt(tmp_path: pathlib.Path, damage: str) -> None:
    run_process(tmp_path)
    (entry,) = entries(tmp_path, "tbgraph")
    blob = entry.read_bytes()
    if damage == "garbage":
        entry.write_bytes(b"\x00\xffnot an entry")
    elif damage == "truncated":
        entry.write_bytes(blob[: len(blob) // 2])
    else:  # a valid header over a payload changed by one byte
        entry.write_bytes(blob[:-2] + bytes([blob[-2] ^ 1]) + blob[-1:])
    rebuilt = run_process(tmp_path)
    assert rebuilt["graph_rejected"] == 1 and rebuilt["traces"] == 1 and rebuilt["graph_writes"] == 1
    assert rebuilt["fallback"] == 0
    after = run_process(tmp_path)
    assert after["graph_hits"] == 1 and after["traces"] == 0


def test_processes_writing_at_once_leave_whole_entries(tmp_path: pathlib.Path) -> None:
    script = SCRIPT.format(tests=str(pathlib.Path(__file__).parent))
    env = {**os.environ, "TORCHBURN_CACHE_DIR": str(tmp_path), "TORCHBURN_LOAD_PLUGINS": "__none__"}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()
    assert not list(tmp_path.rglob(".tmp-*")), "a temporary file was left behind"
    assert len(entries(tmp_path, "tbgraph")) == 1 and len(entries(tmp_path, "tbplan")) == 1
    later = run_process(tmp_path)
    assert later["graph_hits"] == 1 and later["graph_rejected"] == 0 and later["disk_rejected"] == 0


def test_zero_turns_the_cache_off(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    off = run_process("0", HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert off["disk_dir"] is None and off["graph_writes"] == 0 and off["disk_writes"] == 0
    assert off["traces"] == 1 and not list(tmp_path.rglob("*.tb*"))
    for value in ("0", "off"):
        monkeypatch.setenv("TORCHBURN_CACHE_DIR", value)
        assert user_cache_dir() is None and compile_cache_dir() is None


def test_the_default_folder_is_the_users_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHBURN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache_dir() == tmp_path / "torchburn" / "compile"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compile_cache_dir() == pathlib.Path.home() / ".cache" / "torchburn" / "compile"
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert compile_cache_dir() == tmp_path / "elsewhere" / "compile"


def test_eviction_keeps_the_folder_within_its_bound(tmp_path: pathlib.Path) -> None:
    cache = GraphCache(disk_dir=tmp_path, max_bytes=15_000)
    header = {"magic": "torchburn-graph"}
    paths = []
    for i in range(12):
        key = f"{i:02d}" + "0" * 62
        path = cache._entry_path(key, "tbgraph", "graphs")
        assert cache._write_entry(path, {**header, "key": key}, b"x" * 2_000)
        os.utime(path, ns=(i * 10**9, i * 10**9))  # a clear age order
        paths.append((key, path))
        if i == 5:
            # reading an old entry makes it recent: it outlives younger ones
            assert cache._read_entry(paths[0][1], "torchburn-graph", paths[0][0]) is not None
    total = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert total <= 15_000
    assert cache.stats.disk_evictions > 0
    alive = [i for i, (_, p) in enumerate(paths) if p.exists()]
    assert 0 in alive and 11 in alive and 1 not in alive


def test_torchburn_clear_cache_empties_the_disk(tmp_path: pathlib.Path) -> None:
    run_process(tmp_path)
    configure(disk_dir=tmp_path / "compile")
    torchburn.clear_cache()
    assert not entries(tmp_path, "tbgraph") and not entries(tmp_path, "tbplan")


# -- in one process ----------------------------------------------------------------------------
def multi(x: torch.Tensor, y: torch.Tensor) -> Any:
    values, indices = torch.topk(x, 2, dim=-1)
    var, mean = torch.var_mean(y, dim=0, keepdim=True)
    return values * 2, indices, (y - mean) / (var + 1e-5).sqrt(), x.to(torch.float64).sum(dtype=torch.float64)


CASES: list[tuple[Any, Any]] = [
    (multi, lambda: (torch.randn(5, 7), torch.randn(4, 3))),
    (multi, lambda: (torch.randn(7, 5).t(), torch.randn(3, 4)[:, ::2])),  # non-contiguous
    (multi, lambda: (torch.randn(1, 3), torch.randn(1, 1))),
    (lambda x: (torch.nn.functional.softmax(x, -1), x.clamp(min=0.5)), lambda: (torch.randn(0, 4),)),
    (
        lambda x: (x.where(x == x, torch.zeros(())), x * float("inf")),
        lambda: (torch.tensor([[float("nan"), 1.0, -float("inf")]]),),
    ),
    (lambda x: (x + 3, (x // 2).to(torch.int32)), lambda: (torch.arange(12, dtype=torch.int64).view(3, 4),)),
]


def dynamo_graph(fn: Any, args: tuple[Any, ...]) -> tuple[torch.fx.GraphModule, list[Any]]:
    captured: list[Any] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=capture)(*args)
    return captured[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_traced_graph_survives_json(case: int) -> None:
    fn, make = CASES[case]
    args = make()
    gm, example = dynamo_graph(fn, args)
    traced = direct_inference.trace(gm, example, backend.decomposition_table())
    assert traced is not None
    data = json.loads(json.dumps(graph_to_json(traced)))
    rebuilt = graph_from_json(data)
    with torch.no_grad():
        want, got = traced(*args), rebuilt(*args)
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(got, fn(*args), equal_nan=True)
    # the rebuilt graph carries what the partitioner reads: a fake value per node
    for old, new in zip(traced.graph.nodes, rebuilt.graph.nodes):
        assert old.target == new.target or old.op == new.op == "placeholder"
        if old.op != "output":
            assert type(new.meta["val"]) is type(old.meta["val"])


def test_graphs_a_plan_cannot_describe_are_not_stored() -> None:
    class WithConstant(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    gm = torch.fx.symbolic_trace(WithConstant())
    gm.register_buffer("c", torch.ones(2))
    with gm.graph.inserting_before(next(iter(reversed(gm.graph.nodes)))):
        gm.graph.get_attr("c")
    gm.recompile()
    with pytest.raises(PlanError):
        graph_to_json(gm)


def test_the_key_holds_shapes_strides_dtypes_and_options() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2

    def key(x: torch.Tensor, **options: Any) -> str | None:
        gm, example = dynamo_graph(fn, (x,))
        return traced_graph_key(gm, example, Options.from_user(options), [])

    base = key(torch.randn(4, 6))
    assert base is not None and base == key(torch.randn(4, 6))
    others = [
        key(torch.randn(4, 7)),
        key(torch.randn(6, 4).t()),
        key(torch.randn(4, 6, dtype=torch.float64)),
        key(torch.randn(4, 6), min_partition_size=1),
    ]
    assert len({base, *others}) == 5


def test_graphs_with_submodules_or_attributes_have_no_key() -> None:
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    assert traced_graph_key(gm, [torch.randn(2, 3)], Options(), []) is None


def test_a_restored_graph_runs_in_process(tmp_path: pathlib.Path, toy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second compile after Dynamo forgot the first reads the graph from disk, not a trace."""
    configure(disk_dir=tmp_path)

    def block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.addmm(b, x, w)) + x

    args = (torch.randn(5, 5), torch.randn(5, 5), torch.randn(5))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(block, backend="torchburn")(*args), block(*args))
    assert torchburn.cache_info()["graph_writes"] == 1
    torch._dynamo.reset()
    configure(disk_dir=tmp_path)  # a new process's cache: nothing in memory

    def no_trace(*a: Any, **k: Any) -> Any:
        raise AssertionError("traced again")

    monkeypatch.setattr(direct_inference, "trace", no_trace)
    other = (torch.randn(5, 5), torch.randn(5, 5), torch.randn(5))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(block, backend="torchburn")(*other), block(*other))
    assert torchburn.cache_info()["graph_hits"] == 1
    assert sum(torchburn.op_coverage()["fallback"].values()) == 0
