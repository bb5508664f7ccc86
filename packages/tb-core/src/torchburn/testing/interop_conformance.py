"""The conformance suite of tb-core's engine interop (``torchburn.interop``). An engine that offers
prepared programs or eager kernels runs it by subclassing once:

    from torchburn.testing import InteropConformance

    class TestMyEngineInterop(InteropConformance):
        engine = "my_engine"
        eager_ops = frozenset({"aten.sin.default"})  # ops it must offer as float32 eager kernels

Plans are traced by tb-core itself (``make_fx`` of small functions, so they do not depend on
what the engine's ``check`` takes); an engine may decline any plan (``prepare`` returns None), but
if it overrides ``prepare`` it must accept at least one, and every program it returns must match
eager PyTorch through ``run`` and ``run_into`` and refuse tensors that do not fit it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

from torchburn.engine import Engine
from torchburn.interop import PreparedProgram, empty_like_meta, find_engine
from torchburn.plan import GETITEM, Plan, plan_from_graph_module, resolve_op
from torchburn.program import KernelProgram


def _mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2)


def _elementwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y + 0.5).tanh() - x.sin()


def _two_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = (x * y).sin()
    return s + 1.0, torch.softmax(s, dim=-1)


def _reduction(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=1, keepdim=True) * x.amax()


#: (id, function, example inputs) the plans are traced from.
FUNCTIONS: list[tuple[str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = [
    ("mlp-1", _mlp, lambda: (torch.randn(1, 8), torch.randn(16, 8), torch.randn(16), torch.randn(4, 16))),
    ("mlp-17", _mlp, lambda: (torch.randn(17, 12), torch.randn(9, 12), torch.randn(9), torch.randn(3, 9))),
    ("elementwise", _elementwise, lambda: (torch.randn(6, 5), torch.randn(6, 5))),
    ("elementwise-strided", _elementwise, lambda: (torch.randn(5, 6).t(), torch.randn(6, 5))),
    ("two-outputs", _two_outputs, lambda: (torch.randn(4, 7), torch.randn(4, 7))),
    ("reduction", _reduction, lambda: (torch.randn(5, 9),)),
    ("empty", _elementwise, lambda: (torch.randn(0, 5), torch.randn(0, 5))),
]


def traced_plan(fn: Callable[..., Any], *args: torch.Tensor) -> Plan:
    """The ATen plan of ``fn`` on ``args`` (what an engine's ``compile`` would see for it)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return plan_from_graph_module(make_fx(fn)(*args))


def reference(plan: Plan, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The plan run by PyTorch's own ops."""
    kernels = {op: resolve_op(op) for op in plan.ops() if op != GETITEM}
    out = KernelProgram(plan, kernels)(*inputs)
    return out if isinstance(out, tuple) else (out,)


def random_inputs(plan: Plan, seed: int) -> list[torch.Tensor]:
    """Random tensors laid out exactly as the plan's (non-constant) inputs."""
    g = torch.Generator().manual_seed(seed)
    inputs = []
    for meta in plan.inputs[: len(plan.inputs) - len(plan.constants)]:
        assert meta is not None
        t = empty_like_meta(meta)
        t.copy_(torch.randn(meta.shape, generator=g))
        inputs.append(t)
    return inputs


class InteropConformance:
    engine: ClassVar[str] = ""
    #: ATen overloads the engine must offer as float32 eager kernels (``Engine.eager_kernel``).
    eager_ops: ClassVar[frozenset[str]] = frozenset()
    rtol: ClassVar[float] = 1e-5
    atol: ClassVar[float] = 1e-5

    def _engine(self) -> Engine:
        engine = find_engine(self.engine)
        assert engine is not None, f"engine {self.engine!r} is not installed and available"
        return engine

    def _program(self, case_id: str) -> tuple[Plan, PreparedProgram | None]:
        _, fn, make = next(c for c in FUNCTIONS if c[0] == case_id)
        plan = traced_plan(fn, *make())
        return plan, self._engine().prepare(plan)

    def _offers(self, capability: str) -> bool:
        return getattr(type(self._engine()), capability) is not getattr(Engine, capability)

    # -- prepared programs -------------------------------------------------------------------
    def test_prepare_accepts_some_plan(self) -> None:
        if not self._offers("prepare"):
            assert all(self._program(c[0])[1] is None for c in FUNCTIONS)
            return
        accepted = [c[0] for c in FUNCTIONS if self._program(c[0])[1] is not None]
        assert accepted, f"{self.engine} overrides prepare() but declined every plan"

    @pytest.mark.parametrize("case_id", [c[0] for c in FUNCTIONS])
    def test_prepared_program_matches_eager(self, case_id: str) -> None:
        plan, program = self._program(case_id)
        if program is None:
            return  # declined: allowed for any single plan
        assert isinstance(program, PreparedProgram)
        for seed in range(2):
            inputs = random_inputs(plan, seed)
            before = [t.clone() for t in inputs]
            want = reference(plan, inputs)
            got = program.run(inputs)
            into = [empty_like_meta(m).fill_(7.0) for m in program.output_metas]
            program.run_into(inputs, into)
            assert len(got) == len(want) == len(program.output_metas)
            for g, i, w, m in zip(got, into, want, program.output_metas):
                assert g.shape == m.shape and g.dtype == m.dtype and g.device.type == m.device
                assert all(n < 2 or a == b for n, a, b in zip(m.shape, g.stride(), m.stride))
                torch.testing.assert_close(g, w, rtol=self.rtol, atol=self.atol, equal_nan=True)
                torch.testing.assert_close(i, w, rtol=self.rtol, atol=self.atol, equal_nan=True)
            assert all(torch.equal(a, b) for a, b in zip(inputs, before)), "run changed an input"

    def test_prepared_program_refuses_tensors_that_do_not_fit(self) -> None:
        found = [(plan, p) for plan, p in (self._program(c[0]) for c in FUNCTIONS[:2]) if p is not None]
        if not found:
            return
        plan, program = found[0]
        inputs = random_inputs(plan, 0)
        meta = program.output_metas[0]
        out = empty_like_meta(meta).fill_(3.0)
        first, rest = inputs[0], inputs[1:]
        bad: list[tuple[list[Any], list[Any]]] = [
            (inputs[:-1], [out]),
            (inputs, []),
            ([first.double(), *rest], [out]),
            ([torch.randn(first.shape[0] + 1, *first.shape[1:]), *rest], [out]),
            ([first.tolist(), *rest], [out]),
            ([torch._neg_view(first), *rest], [out]),
            (inputs, [empty_like_meta(meta).double()]),
        ]
        for bad_inputs, outputs in bad:
            with pytest.raises((ValueError, TypeError)):
                program.run_into(bad_inputs, outputs)
            assert torch.equal(out, torch.full_like(out, 3.0)), "a refused call wrote its output"
        storage = torch.zeros(first.numel() + meta.numel)
        aliased_in = storage[: first.numel()].view(first.shape).copy_(first)
        overlapping = storage[first.numel() - 1 : first.numel() - 1 + meta.numel].view(meta.shape)
        with pytest.raises(ValueError):
            program.run_into([aliased_in, *rest], [overlapping])
        assert torch.equal(aliased_in, first), "a refused call wrote an input"

    # -- eager kernels -----------------------------------------------------------------------
    def test_eager_kernels_are_offered(self) -> None:
        engine = self._engine()
        missing = [op for op in sorted(self.eager_ops) if engine.eager_kernel(op, torch.float32) is None]
        assert not missing, f"{self.engine} offers no float32 eager kernel for {missing}"
        assert engine.eager_kernel("aten.sin.default", torch.complex128) is None

    @pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (33, 65), (2, 3, 4)], ids=str)
    def test_eager_kernels_match_torch(self, shape: tuple[int, ...]) -> None:
        engine = self._engine()
        for op in sorted(self.eager_ops):
            fn = engine.eager_kernel(op, torch.float32)
            assert fn is not None
            x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 3
            before = x.clone()
            y = fn(x)
            want = resolve_op(op)(x)
            assert y.shape == want.shape and y.dtype == want.dtype
            torch.testing.assert_close(y, want, rtol=self.rtol, atol=self.atol, equal_nan=True)
            assert torch.equal(x, before), f"{op} kernel changed its input"

    def test_eager_kernels_refuse_what_they_do_not_take(self) -> None:
        engine = self._engine()
        x = torch.randn(6, 4)
        for op in sorted(self.eager_ops):
            fn = engine.eager_kernel(op, torch.float32)
            assert fn is not None
            for bad in (x.t(), x[:, ::2], x.double(), torch._neg_view(x), x.tolist()):
                with pytest.raises((ValueError, TypeError)):
                    fn(bad)


__all__ = ["FUNCTIONS", "InteropConformance", "random_inputs", "reference", "traced_plan"]
