"""bfloat16 and float16 graphs on the installed engines (torchburn.low_precision): the model set
converted with ``.to(dtype)`` and the float32 models under ``torch.autocast``, against eager in the
same dtype with low-precision tolerances, with the compute on the engine."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import ENGINES

import torchburn
from torchburn import catalog
from torchburn.partition import HEAVY_CATEGORIES
from torchburn.testing import models

MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    "readme_mlp": models.readme_mlp,
    "small_cnn": models.small_cnn,
    "transformer_layer": models.transformer_layer,
}
MODES = ["bf16", "fp16", "autocast"]


@pytest.fixture(autouse=True)
def _low_precision_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default; set here so a developer's ``TORCHBURN_LOW_PRECISION=0`` does not turn these off."""
    monkeypatch.setenv("TORCHBURN_LOW_PRECISION", "1")


#: engines that carry bfloat16 values (casts to and from float32); wgpu has no bfloat16 buffers,
#: so there the casts of a bfloat16 graph stay in eager PyTorch and the heavy compute runs on it
BF16_STORAGE = {"native_cpu", "cython_dispatch"}


def prepared(name: str, mode: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    model, args = MODELS[name]()
    if mode in ("bf16", "fp16"):
        dtype = torch.bfloat16 if mode == "bf16" else torch.float16
        model = model.to(dtype)
        args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    return model, args


def context(mode: str) -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else contextlib.nullcontext()


def check_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    """bfloat16 tolerances (float16's are tighter), the absolute one scaled by the values' size."""
    low = torch.float16 if torch.float16 in (out.dtype, expected.dtype) else torch.bfloat16
    rtol, atol = (1.6e-2, 1e-2) if low == torch.bfloat16 else (2e-3, 2e-3)
    scale = max(1.0, expected.float().abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol * scale, equal_nan=True)


def run(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    engine: str,
    mode: str,
    backend: str = "torchburn",
    sink: list[Any] | None = None,
) -> Any:
    options = {"options": {"engine": engine, "report_sink": sink}} if backend == "torchburn" else {}
    compiled = torch.compile(model, backend=backend, **options)
    with torch.no_grad(), context(mode):
        return compiled(*args)


def fallback() -> dict[str, int]:
    return dict(torchburn.op_coverage()["fallback"])


def check_coverage(engine: str, mode: str) -> None:
    cov = torchburn.op_coverage()
    assert sum(cov["native"].values()) + sum(cov["delegated"].values()) > 0
    if engine == "wgpu" and mode == "fp16":
        # wgpu computes float16 itself (shader-f16): the graph reaches it unwidened, no casts
        assert not [op for op in cov["native"] if "_to_copy" in op], cov
    if engine in BF16_STORAGE or mode == "fp16":
        assert fallback() == {}, fallback()
    else:
        # the casts run in eager, and a view or add caught between two of them is left in a
        # partition too small to pay; every GEMM, convolution, attention and norm is the engine's
        assert not [op for op in fallback() if catalog.category(op) in HEAVY_CATEGORIES], fallback()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("engine", ENGINES)
def test_model_set_in_low_precision(engine: str, name: str, mode: str) -> None:
    model, args = prepared(name, mode)
    with torch.no_grad(), context(mode):
        expected = model(*args)
    sink: list[Any] = []
    out = run(model, args, engine, mode, sink=sink)
    check_coverage(engine, mode)
    if engine == "native_cpu":
        # the casts are Cast steps inside the partition: the whole graph is one engine call
        assert [len(g.partitions) for g in sink] == [1], sink
    # nn.TransformerEncoderLayer under autocast included: Dynamo's graph types its fused layer
    # float32, eager computes it in bfloat16 and returns bfloat16, and so does the decomposition
    assert out.dtype == expected.dtype
    check_close(out, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("batch", [1, 7])
def test_readme_model_batches_and_non_contiguous_input(dtype: torch.dtype, batch: int) -> None:
    model, _ = models.readme_mlp()
    model = model.to(dtype)
    compiled = torch.compile(model, backend="torchburn", options={"engine": "native_cpu"})
    x = torch.randn(512, batch).to(dtype).t()  # a transposed (non-contiguous) input
    with torch.no_grad():
        check_close(compiled(x), model(x))
        y = torch.randn(batch, 512).to(dtype)
        check_close(compiled(y), model(y))
    assert fallback() == {}


@pytest.mark.parametrize("mode", MODES)
def test_nan_and_inf_propagate(mode: str) -> None:
    model, (x,) = prepared("readme_mlp", mode)
    x = x.clone()
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), float("-inf")
    with torch.no_grad(), context(mode):
        expected = model(x)
    out = run(model, (x,), "native_cpu", mode)
    assert out.isnan().sum() == expected.isnan().sum() > 0
    check_close(out, expected)
    assert fallback() == {}


def test_bf16_over_changing_batch_sizes() -> None:
    """Dynamo's automatic dynamic shapes: the widened graph with symbolic sizes stays native."""
    model, _ = models.readme_mlp()
    model = model.to(torch.bfloat16)
    compiled = torch.compile(model, backend="torchburn", options={"engine": "native_cpu"})
    with torch.no_grad():
        for batch in (8, 16, 1, 24):
            x = torch.randn(batch, 512).to(torch.bfloat16)
            check_close(compiled(x), model(x))
    assert fallback() == {}


def test_turned_off_runs_in_eager() -> None:
    model, args = prepared("readme_mlp", "bf16")
    compiled = torch.compile(model, backend="torchburn", options={"engine": "native_cpu", "low_precision": False})
    with torch.no_grad():
        check_close(compiled(*args), model(*args))
    assert "aten.addmm.default" in fallback()


@pytest.mark.parametrize("mode", ["bf16", "autocast"])
@pytest.mark.parametrize("name", list(MODELS))
def test_widened_or_as_traced_by_measurement(name: str, mode: str) -> None:
    """With routing on (the default outside the test suites), the widened graph is timed against
    the graph as traced (torchburn.low_precision_route); whichever is pinned, every call gives
    eager's answer, nothing falls back, and the graph as traced runs eager's kernels bit for bit."""
    model, args = prepared(name, mode)
    with torch.no_grad(), context(mode):
        expected = model(*args)
    sink: list[Any] = []
    compiled = torch.compile(
        model, backend="torchburn", options={"engine": "native_cpu", "routing": "measure", "report_sink": sink}
    )
    from torchburn.low_precision_route import MAX_DECISION_CALLS, SETTLE_CALLS

    with torch.no_grad(), context(mode):
        for i in range(SETTLE_CALLS + MAX_DECISION_CALLS + 1):
            out = compiled(*args)
            assert out.dtype == expected.dtype
            check_close(out, expected)
            if i >= 2 and not any(g.pending_routes() for g in sink):
                break
        widened = [g for g in sink if g.low_precision is not None]
        torchburn.reset_stats()
        out = compiled(*args)
    assert fallback() == {}
    (report,) = widened
    assert not report.low_precision.pending, report.low_precision.describe()
    cov = torchburn.op_coverage()
    if report.traced_only:
        assert sum(cov["native"].values()) == 0 and sum(cov["routed"].values()) > 0
        if mode == "bf16":
            assert torch.equal(out, expected)
    else:
        assert sum(cov["native"].values()) > 0


class _Head(torch.nn.Module):
    """MLP, GELU, layer norm, log-softmax, softmax: forward and backward graphs with a rounding
    point at every op, softmax backward ops that name the forward's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = models.TrainMLP()
        self.norm = torch.nn.LayerNorm(10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.nn.functional.gelu(self.mlp(x)))
        return torch.log_softmax(h, -1).softmax(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("factory", [models.TrainMLP, _Head], ids=["mlp", "head"])
def test_training_step_in_low_precision(dtype: torch.dtype, factory: Callable[[], torch.nn.Module]) -> None:
    torch.manual_seed(0)
    eager = factory().to(dtype)
    model = factory().to(dtype)
    model.load_state_dict(eager.state_dict())
    x, y = torch.randn(16, 784).to(dtype), torch.randint(0, 10, (16,))
    compiled = torch.compile(model, backend="torchburn", options={"engine": "native_cpu"})
    for net, m in ((eager, eager), (compiled, model)):
        torch.nn.functional.cross_entropy(net(x).float(), y).backward()
        assert all(p.grad is not None and p.grad.dtype == dtype for p in m.parameters())
    assert fallback() == {}
    assert torchburn.op_coverage()["native"]["aten.mm.default"] > 0
    for p, q in zip(eager.parameters(), model.parameters()):
        check_close(q.grad, p.grad)


def test_tiny_llama_in_bf16() -> None:
    """A 2-layer Llama (RMSNorm, RoPE, SDPA with GQA, SiLU gate) in bf16 on native_cpu: every op
    but the embedding gather, which is left in eager (widening it would cast the whole table on
    every call, more than the gather costs)."""
    model, args = models.tiny_causal_lm()
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        expected = model(*args)
    out = run(model, args, "native_cpu", "bf16")
    assert out.dtype == torch.bfloat16
    check_close(out, expected)
    assert fallback() == {"aten.embedding.default": 1}
    assert torchburn.op_coverage()["native"]["aten.mm.default"] > 0
