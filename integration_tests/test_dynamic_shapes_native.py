"""Dynamic shapes on the installed engines: after Dynamo marks a dimension dynamic (the second
distinct size, or ``dynamic=True``), every op still runs on the engine, specialised per concrete
shape (torchburn.specialise), with the same results as eager."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from conftest import ENGINES

import torchburn
from torchburn.partition import GraphReport

TRAINING = [e for e in ENGINES if e in ("native_cpu", "cython_dispatch")]


def engine_total() -> int:
    cov = torchburn.op_coverage()
    return sum(cov["native"].values()) + sum(cov["delegated"].values())


def fallback() -> dict[str, int]:
    return torchburn.op_coverage()["fallback"]


def compile_on(model: Any, engine: str, sink: list[GraphReport], dynamic: bool | None = None, **options: Any) -> Any:
    opts = {"engine": engine, "report_sink": sink, **options}
    return torch.compile(model, backend="torchburn", dynamic=dynamic, options=opts)


def specialised_shapes(sink: list[GraphReport]) -> int:
    return sum(p.shapes.compiled for g in sink for p in g.partitions if p.shapes is not None)


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


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic=True"])
@pytest.mark.parametrize("engine", ENGINES)
def test_readme_model_over_batch_sizes(engine: str, dynamic: bool | None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()
    sink: list[GraphReport] = []
    compiled = compile_on(model, engine, sink, dynamic)
    with torch.no_grad():
        for batch in (8, 16, 24, 32, 48, 0, 1):
            torchburn.reset_stats()
            x = torch.randn(batch, 512)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
            assert fallback() == {}, (batch, fallback())
            assert engine_total() == 5
    assert specialised_shapes(sink) >= 4


@pytest.mark.parametrize("engine", ENGINES)
def test_symbolic_sequence_length_attention(engine: str) -> None:
    torch.manual_seed(0)
    model = CausalSelfAttention().eval()
    sink: list[GraphReport] = []
    compiled = compile_on(model, engine, sink, dynamic=True)
    with torch.no_grad():
        for seq in (5, 9, 17, 1):
            torchburn.reset_stats()
            x = torch.randn(2, seq, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
            assert fallback() == {}, (seq, fallback())
            assert engine_total() > 10
    assert specialised_shapes(sink) >= 3


@pytest.mark.parametrize("engine", ENGINES)
def test_non_contiguous_inputs(engine: str) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8).eval()

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(lin(x)) * 2 + 1

    sink: list[GraphReport] = []
    compiled = compile_on(f, engine, sink, dynamic=True)
    with torch.no_grad():
        for rows in (4, 6, 10):
            for x in (torch.randn(16, rows).t(), torch.randn(rows, 32)[:, ::2]):
                torchburn.reset_stats()
                torch.testing.assert_close(compiled(x), f(x), rtol=1e-4, atol=1e-4)
                assert fallback() == {}


@pytest.mark.parametrize("engine", TRAINING)
def test_training_with_a_varying_batch(engine: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    sink: list[GraphReport] = []
    compiled = compile_on(model, engine, sink)
    for batch in (4, 7, 12, 7):
        torchburn.reset_stats()
        x = torch.randn(batch, 16)
        for p in (*model.parameters(), *reference.parameters()):
            p.grad = None
        out, expected = compiled(x), reference(x)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        out.square().mean().backward()
        expected.square().mean().backward()
        for got, want in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-4)
        assert fallback() == {}, (batch, fallback())
    assert {g.kind for g in sink if any(p.shapes is not None for p in g.partitions)} == {"forward", "backward"}


def test_more_sizes_than_the_bound() -> None:
    engine = "native_cpu" if "native_cpu" in ENGINES else ENGINES[0]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    sink: list[GraphReport] = []
    compiled = compile_on(model, engine, sink, dynamic=True, shape_cache_size=2)
    with torch.no_grad():
        for batch in (3, 4, 5, 6, 7, 3):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    (stats,) = [p.shapes for g in sink for p in g.partitions if p.shapes is not None]
    assert (stats.entries, stats.evictions, stats.compiled) == (2, 4, 6)
