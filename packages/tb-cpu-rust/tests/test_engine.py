"""Engine-level behaviour: models run fully native, training, fusion, fallbacks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchburn
from torchburn.testing.conformance import compile_with, native_and_fallback
from torchburn.testing.models import MODELS, train_losses


def _record_programs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every tb_cpu_rust NativeProgram built while the test runs, in order."""
    from tb_cpu_rust import program

    made: list[Any] = []
    original = program.NativeProgram.__init__

    def record(self: program.NativeProgram, plan: object) -> None:
        original(self, plan)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(program.NativeProgram, "__init__", record)
    return made


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_runs_fully_native_with_the_env_selection(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if name == "tiny_causal_lm":
        pytest.importorskip("transformers")
    monkeypatch.setenv("TORCHBURN_ENGINE", "native_cpu")
    model, args = MODELS[name]()
    torch._dynamo.reset()
    torchburn.reset_stats()
    with torch.no_grad():
        expected = model(*args)
        actual = torch.compile(model, backend="torchburn", options={"warn": False})(*args)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    cov = torchburn.op_coverage()
    assert not cov["fallback"], cov["fallback"]
    assert cov["native"]


def test_training_step_matches_eager_and_runs_native() -> None:
    torch._dynamo.reset()
    torchburn.reset_stats()
    eager = train_losses(None, steps=5)
    compiled = train_losses(
        lambda m: torch.compile(
            m, backend="torchburn", options={"engine": "native_cpu", "warn": False, "fallback": "error"}
        ),
        steps=5,
    )
    assert max(abs(a - b) for a, b in zip(eager, compiled)) <= 1e-4
    cov = torchburn.op_coverage()
    assert "aten.mm.default" in cov["native"] or "native_cpu:aten.mm.default" in cov["native"], cov
    assert not cov["fallback"], cov["fallback"]


def test_elementwise_chain_is_one_fused_step(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _record_programs(monkeypatch)

    def chain(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(x * w + b) * torch.sigmoid(x) + x

    fn, reports = compile_with("native_cpu", chain, cache=False)
    x, w, b = torch.randn(16, 32), torch.randn(32), torch.randn(32)
    torch.testing.assert_close(fn(x, w, b), chain(x, w, b), rtol=1e-5, atol=1e-5)
    assert not native_and_fallback(reports)[1]
    assert len(made) == 1 and made[0].executor.n_steps == 1


def test_unsupported_dtype_is_left_to_eager() -> None:
    explanation = torchburn.explain(
        lambda a, b: torch.sin(a + b) * 2,
        torch.randn(3, dtype=torch.float64),
        torch.randn(3, dtype=torch.float64),
        options={"engine": "native_cpu", "min_partition_size": 1},
    )
    # float64 add / mul run natively (wide_math.rs); float64 transcendental functions do not
    assert "aten.sin.default" in explanation.fallback_reasons


def test_non_contiguous_and_broadcast_inputs() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a.t() @ b) + b.sum(0)

    fn, _ = compile_with("native_cpu", f)
    a, b = torch.randn(40, 24)[:, ::2], torch.randn(40, 7)
    torch.testing.assert_close(fn(a, b), f(a, b), rtol=1e-4, atol=1e-4)


def test_masked_sdpa_matches_eager() -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 70, 16, generator=g) for _ in range(3))
    m = torch.randn(70, 70, generator=g) > -0.5
    fn, reports = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(q, k, v, m), f(q, k, v, m), rtol=1e-4, atol=1e-4)
    assert not native_and_fallback(reports)[1]


def test_program_checks_each_call_against_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call's tensors are read and checked in Rust against the plan: a mismatch fails with
    a clear error instead of reading memory the plan did not describe."""
    made = _record_programs(monkeypatch)

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ y) + 1.0

    x, y = torch.randn(8, 5), torch.randn(5, 3)
    fn, _ = compile_with("native_cpu", f, cache=False)
    torch.testing.assert_close(fn(x, y), f(x, y), rtol=1e-5, atol=1e-5)
    prog = made[-1]
    torch.testing.assert_close(prog(x, y), f(x, y), rtol=1e-5, atol=1e-5)
    # a transposed copy, another shape or dtype, a non-tensor or a missing input is refused
    with pytest.raises(ValueError, match="differ from the plan"):
        prog(x[:4], y)
    with pytest.raises(ValueError, match="dtype"):
        prog(x.double(), y)
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor, got float"):
        prog(x, 1.0)
    with pytest.raises(ValueError, match="expected 2 inputs"):
        prog(x)
    # the transposed-strides input is validated in Rust and refused, never misread
    with pytest.raises(ValueError):
        prog(x, y.t().contiguous().t())
