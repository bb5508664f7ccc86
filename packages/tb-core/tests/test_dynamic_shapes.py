"""Graphs with symbolic sizes (Dynamo's dynamic shapes) run on the engines: partitions taken on
their nodes' hints and compiled per concrete shape behind a bounded cache (torchburn.specialise)."""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

import torchburn
from torchburn.explain import Explanation
from torchburn.options import Options
from torchburn.partition import GraphReport, compile_graph
from torchburn.plan import GETITEM, resolve_op
from torchburn.program import KernelProgram

README_SIZES = (8, 16, 24, 32, 48, 0, 1)


class AllOps(torchburn.Engine):
    """Takes every functional, non-random ATen node with static sizes, and runs it with PyTorch's
    own op; records each plan it compiles. Its checker refuses symbolic nodes, as every shipped
    engine's does, so anything it runs from a dynamic graph went through specialisation."""

    name = "allops"
    priority = 5
    compiled: ClassVar[list[torchburn.Plan]] = []
    refuse_empty: ClassVar[bool] = False
    fail_rows: ClassVar[int | None] = None  # compile raises for a plan whose first input has this many rows

    def check(self, node: torchburn.NodeInfo) -> str | None:
        if node.op == GETITEM:
            return None
        if node.symbolic:
            return "symbolic shape"
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
            return "not a functional ATen op"
        if torch.Tag.nondeterministic_seeded in target.tags and "dropout" not in str(target._schema):
            return "random"  # (SDPA is tagged for its dropout, which is 0 in these tests)
        if self.refuse_empty and any(m.numel == 0 for m in [*node.inputs, *node.out_metas]):
            return "empty tensor"
        return None

    def compile(self, plan: torchburn.Plan) -> Any:
        first = plan.inputs[0]
        if AllOps.fail_rows is not None and first is not None and first.shape[:1] == (AllOps.fail_rows,):
            raise RuntimeError(f"allops cannot compile {AllOps.fail_rows} rows")
        AllOps.compiled.append(plan)
        return KernelProgram(plan, {op: resolve_op(op) for op in plan.ops() if op != GETITEM})


class AllOpsPlugin:
    @torchburn.hookimpl
    def tb_register_engines(self) -> list[Any]:
        return [AllOps]


@pytest.fixture
def allops() -> type[AllOps]:
    AllOps.compiled = []
    AllOps.refuse_empty = False
    AllOps.fail_rows = None
    torchburn.register_plugin(AllOpsPlugin(), "allops-plugin")
    return AllOps


def readme_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()


def fallback_total() -> int:
    return sum(torchburn.op_coverage()["fallback"].values())


def native_total() -> int:
    return sum(torchburn.op_coverage()["native"].values())


def compiled_fn(fn: Callable[..., Any], dynamic: bool | None, sink: list[GraphReport], **options: Any) -> Any:
    return torch.compile(
        fn, backend="torchburn", dynamic=dynamic, options={"warn": False, "report_sink": sink, **options}
    )


def specialised(sink: list[GraphReport]) -> list[Any]:
    return [p for g in sink for p in g.partitions if p.shapes is not None]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic=True"])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "aot"])
def test_readme_model_over_batch_sizes_stays_native(toy: Any, dynamic: bool | None, direct: bool) -> None:
    model = readme_model()
    sink: list[GraphReport] = []
    compiled = compiled_fn(model, dynamic, sink, direct_inference=direct)
    with torch.no_grad():
        for batch in README_SIZES:
            torchburn.reset_stats()
            x = torch.randn(batch, 512)
            torch.testing.assert_close(compiled(x), model(x))
            assert fallback_total() == 0, (batch, torchburn.op_coverage())
            assert native_total() == 5  # permute x2, addmm x2, relu: every call, every size
    parts = specialised(sink)
    assert parts, "no partition was specialised: the graph never went dynamic"
    shapes = sum(p.shapes.compiled for p in parts)
    # automatic: 8 static, 16..48 through one symbolic graph; dynamic=True: all of 8..48 through it.
    # Sizes 0 and 1 get static graphs of their own or go through the symbolic one (torch's choice)
    assert shapes in ((4, 6) if dynamic is None else (5, 7))
    for plan in toy.compiled_plans:
        assert not any(m is not None and m.symbolic for m in plan.inputs)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        qkv = self.qkv(self.norm(x)).view(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(batch, seq, dim))


@pytest.mark.parametrize("block", ["causal_attention", "transformer_encoder_layer"])
def test_symbolic_sequence_length(allops: type[AllOps], block: str) -> None:
    torch.manual_seed(0)
    model = (
        CausalSelfAttention()
        if block == "causal_attention"
        else torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    ).eval()
    sink: list[GraphReport] = []
    compiled = compiled_fn(model, True, sink)
    seen = set()
    with torch.no_grad():
        for seq in (5, 9, 17, 1):
            torchburn.reset_stats()
            x = torch.randn(2, seq, 32)
            torch.testing.assert_close(compiled(x), model(x))
            assert fallback_total() == 0, torchburn.op_coverage()["fallback"]
            assert native_total() > 10
            if seq == 17:
                graphs = len([g for g in sink if specialised([g])])
                assert graphs == 1, "one symbolic graph for lengths 5, 9 and 17 (no recompiles)"
    for plan in allops.compiled:
        for meta in plan.inputs:
            assert meta is None or not meta.symbolic
            if meta is not None and len(meta.shape) == 3 and meta.shape[0] == 2:
                seen.add(meta.shape[1])
    assert {5, 9, 17, 1} <= seen


def test_views_and_reshapes_over_a_symbolic_dim(allops: type[AllOps]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        b, n = x.shape
        y = (x * 2).view(b, n // 4, 4).transpose(1, 2)  # a view over the symbolic dim
        z = y.reshape(b * 4, n // 4).expand(2, b * 4, n // 4)  # a copy-reshape and an expand of it
        return (z + 1).sum(0).view(-1)

    sink: list[GraphReport] = []
    compiled = compiled_fn(f, True, sink)
    for rows in (3, 5, 8, 13):
        torchburn.reset_stats()
        x = torch.randn(rows, 12)
        torch.testing.assert_close(compiled(x), f(x))
        assert fallback_total() == 0, torchburn.op_coverage()["fallback"]
    assert sum(p.shapes.compiled for p in specialised(sink)) == 4


def test_non_contiguous_inputs_specialise_on_their_strides(allops: type[AllOps]) -> None:
    lin = torch.nn.Linear(16, 8).eval()

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(lin(x)) * 2

    sink: list[GraphReport] = []
    compiled = compiled_fn(f, True, sink)
    with torch.no_grad():
        for rows in (4, 6, 10):
            for x in (torch.randn(16, rows).t(), torch.randn(rows, 32)[:, ::2], torch.randn(rows, 16)):
                torchburn.reset_stats()
                torch.testing.assert_close(compiled(x), f(x))
                assert fallback_total() == 0
    strides = {
        (m.shape, m.stride) for plan in allops.compiled for m in plan.inputs if m is not None and m.shape[-1:] == (16,)
    }
    assert ((4, 16), (1, 4)) in strides  # the transposed input reached the engine as it is
    assert ((6, 16), (32, 2)) in strides  # and the strided slice


def test_training_with_a_varying_batch(allops: type[AllOps]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    sink: list[GraphReport] = []
    compiled = compiled_fn(model, None, sink)
    for batch in (4, 7, 12, 7):
        torchburn.reset_stats()
        x = torch.randn(batch, 16)
        for p in (*model.parameters(), *reference.parameters()):
            p.grad = None
        out = compiled(x)
        expected = reference(x)
        torch.testing.assert_close(out, expected)
        out.square().mean().backward()
        expected.square().mean().backward()
        for got, want in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(got.grad, want.grad)
        assert fallback_total() == 0, torchburn.op_coverage()["fallback"]
    kinds = {g.kind for g in sink if any(p.shapes is not None for p in g.partitions)}
    assert kinds == {"forward", "backward"}


def test_more_sizes_than_the_bound_stay_correct_and_bounded(allops: type[AllOps]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x @ x.t()) + 1

    sink: list[GraphReport] = []
    compiled = compiled_fn(f, True, sink, shape_cache_size=2)
    sizes = (3, 4, 5, 6, 7, 3)
    for n in sizes:
        x = torch.randn(n, 5)
        torch.testing.assert_close(compiled(x), f(x))
    (part,) = specialised(sink)
    assert part.shapes.bound == 2
    assert part.shapes.entries == 2
    assert part.shapes.compiled == len(sizes)  # 3 came back after its eviction: built again
    assert part.shapes.evictions == len(sizes) - 2
    assert "2 cached (bound 2)" in part.shapes.describe()


def test_shape_cache_size_from_the_environment(allops: type[AllOps], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_SHAPE_CACHE_SIZE", "3")
    assert Options().shape_cache_bound() == 3
    assert Options(shape_cache_size=5).shape_cache_bound() == 5
    monkeypatch.setenv("TORCHBURN_SHAPE_CACHE_SIZE", "many")
    with pytest.raises(ValueError, match="TORCHBURN_SHAPE_CACHE_SIZE must be an int"):
        Options().shape_cache_bound()
    with pytest.raises(ValueError, match="shape_cache_size must be an int, 0 or more"):
        Options.from_user({"shape_cache_size": -1})
    monkeypatch.delenv("TORCHBURN_SHAPE_CACHE_SIZE")
    assert Options().shape_cache_bound() == 8


def test_shape_cache_size_zero_runs_symbolic_partitions_eagerly(allops: type[AllOps]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 3 + x

    sink: list[GraphReport] = []
    compiled = compiled_fn(f, True, sink, shape_cache_size=0)
    x = torch.randn(6, 3)
    torch.testing.assert_close(compiled(x), f(x))
    assert native_total() == 0
    assert fallback_total() == 3
    assert not specialised(sink)
    assert all("symbolic shape" in reason for _, reason in sink[0].fallbacks)


def symbolic_graph(fn: Callable[..., Any], *examples: torch.Tensor) -> torch.fx.GraphModule:
    """An ATen graph with symbolic sizes, as a dynamic graph reaches the partitioner."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="symbolic")(*examples)


def test_sizes_zero_and_one_through_a_specialised_partition(allops: type[AllOps]) -> None:
    # Dynamo gives sizes 0 and 1 static graphs of their own; a symbolic graph called with them
    # directly must still be right
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w) * 2 + 1

    w = torch.randn(4, 3)
    gm = symbolic_graph(f, torch.randn(5, 4), w)
    runnable, report = compile_graph(gm, [AllOps()], Options(warn=False), "inference")
    assert report.partitions[0].shapes is not None
    for rows in (0, 1, 5, 2, 0):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(runnable(x, w), f(x, w))
    stats = report.partitions[0].shapes
    assert (stats.compiled, stats.eager, stats.entries) == (4, 0, 4)


def test_a_shape_the_engine_refuses_runs_eagerly_with_a_reason(allops: type[AllOps]) -> None:
    allops.refuse_empty = True

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w) * 2 + 1

    w = torch.randn(4, 3)
    gm = symbolic_graph(f, torch.randn(5, 4), w)
    runnable, report = compile_graph(gm, [AllOps()], Options(), "inference")
    x0 = torch.randn(0, 4)
    with pytest.warns(torchburn.TorchburnFallbackWarning, match=r"sizes \[\(0, 4\)"):
        torch.testing.assert_close(runnable(x0, w), f(x0, w))
    assert torchburn.op_coverage()["fallback"] == {
        "aten.mm.default": 1,
        "aten.relu.default": 1,
        "aten.mul.Tensor": 1,
        "aten.add.Tensor": 1,
    }
    torchburn.reset_stats()
    for rows in (3, 0, 3):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(runnable(x, w), f(x, w))
    cov = torchburn.op_coverage()
    assert cov["native"]["aten.mm.default"] == 2
    assert cov["fallback"]["aten.mm.default"] == 1
    stats = report.partitions[0].shapes
    assert (stats.compiled, stats.eager) == (1, 1)
    (reason,) = stats.eager_reasons.values()
    assert "empty tensor" in reason
    text = str(Explanation([report]))
    assert "specialised per shape: 1 shape compiled, 1 eager" in text
    assert "eager for sizes [(0, 4)" in text and "empty tensor" in text


def test_a_compile_error_for_one_shape_falls_back_for_that_shape_only(allops: type[AllOps]) -> None:
    allops.fail_rows = 7

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * x

    gm = symbolic_graph(f, torch.randn(5, 4))
    runnable, report = compile_graph(gm, [AllOps()], Options(warn=False), "inference")
    for rows in (5, 7, 9):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(runnable(x), f(x))
    stats = report.partitions[0].shapes
    assert (stats.compiled, stats.eager) == (2, 1)
    assert "allops cannot compile 7 rows" in next(iter(stats.eager_reasons.values()))
    strict, _ = compile_graph(gm, [AllOps()], Options(warn=False, fallback="error"), "inference")
    with pytest.raises(RuntimeError, match="allops cannot compile 7 rows"):
        strict(torch.randn(7, 4))


def test_explain_says_what_was_specialised(allops: type[AllOps]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 3 + x

    x = torch.randn(6, 3)
    explanation = torchburn.explain(f, x, dynamic=True)
    torch.testing.assert_close(explanation.output, f(x))
    text = str(explanation)
    assert "specialised per shape: 1 shape compiled, 1 cached (bound 8)" in text
    assert explanation.native_ops["aten.relu.default"] == 1
    assert not explanation.fallback_reasons
    static = torchburn.explain(f, x)
    assert "specialised" not in str(static)


def test_concurrent_calls_with_different_sizes(allops: type[AllOps]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x) * x + 1

    gm = symbolic_graph(f, torch.randn(5, 4))
    runnable, report = compile_graph(gm, [AllOps()], Options(warn=False, shape_cache_size=3), "inference")
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            gen = torch.Generator().manual_seed(seed)
            for i in range(40):
                x = torch.randn(2 + (seed + i) % 6, 4, generator=gen)
                torch.testing.assert_close(runnable(x), f(x))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    stats = report.partitions[0].shapes
    assert stats.entries <= 3 and stats.eager == 0


def test_a_checker_that_takes_symbolic_nodes_gets_the_symbolic_partition(toy: Any) -> None:
    # engines that handle symbols opt in by accepting the symbolic node: no specialisation then
    class Symbolic(torchburn.Engine):
        name = "symbolic"
        priority = 9

        def check(self, node: torchburn.NodeInfo) -> str | None:
            return None if node.op in (GETITEM, "aten.relu.default", "aten.mul.Tensor") else "no kernel"

        def compile(self, plan: torchburn.Plan) -> Any:
            return KernelProgram(plan, {op: resolve_op(op) for op in plan.ops() if op != GETITEM})

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 3

    gm = symbolic_graph(f, torch.randn(5, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runnable, report = compile_graph(gm, [Symbolic()], Options(), "inference")
    assert report.partitions[0].status == "compiled" and report.partitions[0].shapes is None
    x = torch.randn(9, 4)
    torch.testing.assert_close(runnable(x), f(x))


def test_cli_explain_dynamic(capsys: pytest.CaptureFixture[str], toy: Any) -> None:
    from torchburn.cli import main

    assert main(["explain", "readme_mlp", "--dynamic"]) == 0
    out = capsys.readouterr().out
    assert "partition 0 on toy [specialised per shape: 1 shape compiled, 1 cached (bound 8)]" in out
    assert "no eager fallback" in out


def test_a_run_time_error_for_one_shape_falls_back_for_that_shape_only(allops: type[AllOps]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * x

    gm = symbolic_graph(f, torch.randn(5, 4))
    runnable, report = compile_graph(gm, [AllOps()], Options(warn=False), "inference")
    part = report.partitions[0]
    # break the program compiled for 7 rows once it exists
    runnable(torch.randn(7, 4))
    specialised_call = next(n.target for n in runnable.graph.nodes if n.op == "call_function")
    (entry,) = [e for k, e in specialised_call.torchburn_compiled._entries.items() if k[0][0] == (7, 4)]

    def broken(*args: Any) -> Any:
        raise RuntimeError("allops lost its kernel")

    entry.run = broken
    torchburn.reset_stats()
    for rows in (7, 5, 7):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(runnable(x), f(x))
    cov = torchburn.op_coverage()
    assert cov["fallback"] == {"aten.tanh.default": 2, "aten.mul.Tensor": 2}
    assert cov["native"] == {"aten.tanh.default": 1, "aten.mul.Tensor": 1}
    assert (part.shapes.compiled, part.shapes.eager) == (1, 1)
    assert "allops lost its kernel" in next(iter(part.shapes.eager_reasons.values()))


def test_data_dependent_sizes_stay_eager_with_a_reason(allops: type[AllOps]) -> None:
    # an unbacked size has no example to decide on, and would be a new signature at almost every
    # call (a compile each): those nodes stay eager, said in the report
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x[x > 0] * 2) + 1

    sink: list[GraphReport] = []
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = compiled_fn(f, None, sink)
        for n in (5, 9, 13):
            x = torch.randn(n)
            torch.testing.assert_close(compiled(x), f(x))
    reasons = dict(sink[-1].fallbacks)
    assert "data-dependent size" in reasons["aten.relu.default"]
    assert not specialised(sink)
