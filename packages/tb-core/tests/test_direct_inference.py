"""Inference graphs compiled without AOTAutograd (torchburn.direct_inference), and the graphs
that must still go through it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import torchburn
from torchburn import direct_inference


@pytest.fixture
def direct_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts compiled graphs that took the direct path."""
    calls: list[int] = []
    real = direct_inference.trace

    def spy(*a: Any) -> Any:
        traced = real(*a)
        if traced is not None:
            calls.append(1)
        return traced

    monkeypatch.setattr(direct_inference, "trace", spy)
    return calls


def _compile(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    dynamic = options.pop("dynamic", False)
    opts = {"engine": "toy", "warn": False, "min_partition_size": 1, **options}
    return torch.compile(fn, backend="torchburn", options=opts, dynamic=dynamic)


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc2(torch.relu(self.fc1(x))))


def test_no_grad_graph_runs_on_the_engine_without_aot(toy: Any, direct_calls: list[int]) -> None:
    torch.manual_seed(0)
    model, x = _MLP().eval(), torch.randn(5, 8)
    compiled = _compile(model)
    with torch.no_grad():
        got = compiled(x)
        torch.testing.assert_close(got, model(x))
    assert direct_calls == [1]
    assert not got.requires_grad
    assert toy.compiled_plans, "the toy engine compiled nothing"
    assert torchburn.op_coverage()["native"].get("aten.addmm.default", 0) >= 2


def test_grad_mode_switch_recompiles_through_aot(toy: Any, direct_calls: list[int]) -> None:
    """Compiled under no_grad, then called with grad on: Dynamo's grad-mode guard fails, the new
    graph goes through AOTAutograd and gradients flow."""
    torch.manual_seed(0)
    model, x = _MLP(), torch.randn(5, 8)
    compiled = _compile(model)
    with torch.no_grad():
        compiled(x)
    out = compiled(x)
    assert out.requires_grad
    out.sum().backward()
    ref = _MLP()
    ref.load_state_dict(model.state_dict())
    ref(x).sum().backward()
    torch.testing.assert_close(model.fc1.weight.grad, ref.fc1.weight.grad)
    assert direct_calls == [1]


def test_input_mutation_goes_through_aot(toy: Any, direct_calls: list[int]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return torch.relu(x) + 1

    a, b = torch.randn(6), None
    b = a.clone()
    with torch.no_grad():
        got = _compile(f)(a)
        want = f(b)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(a, b)  # the write to the input happened
    assert direct_calls == []


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (x.t(), torch.relu(x)),  # an output is a view of an input
        lambda x: (x,),  # an output is an input
        lambda x: (torch.relu(x).view(-1), torch.relu(x)),
    ],
    ids=["view-of-input", "input", "plain"],
)
def test_outputs_aliasing_inputs_go_through_aot(toy: Any, direct_calls: list[int], fn: Any) -> None:
    x = torch.randn(3, 4)
    with torch.no_grad():
        got = _compile(fn)(x)
        want = fn(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    if fn(x)[0].data_ptr() == x.data_ptr():
        assert got[0].data_ptr() == x.data_ptr()  # still a view of the input, as in eager
        assert direct_calls == []
    else:
        assert direct_calls == [1]


def test_grad_switch_inside_the_graph_goes_through_aot(toy: Any, direct_calls: list[int]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            y = torch.relu(x) * 2
        return y + 1

    x = torch.randn(4)
    with torch.no_grad():
        torch.testing.assert_close(_compile(f)(x), f(x))
    assert direct_calls == []


def test_dynamic_shapes_take_the_direct_path_the_option_off_goes_through_aot(toy: Any, direct_calls: list[int]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 3 + x

    with torch.no_grad():
        c = _compile(f, dynamic=True)
        for n in (3, 5, 9):
            x = torch.randn(n, 2)
            torch.testing.assert_close(c(x), f(x))
        assert direct_calls == [1]  # one symbolic graph for every size, traced directly
        torch._dynamo.reset()
        x = torch.randn(4, 2)
        torch.testing.assert_close(_compile(f, direct_inference=False)(x), f(x))
    assert direct_calls == [1]
    assert torchburn.op_coverage()["fallback"] == {}


def test_a_symbolic_graph_that_writes_in_place_goes_through_aot(toy: Any, direct_calls: list[int]) -> None:
    # symbolic graphs are traced without torch.func.functionalize (it would guard the sizes), so
    # an in-place op stays in the trace and AOTAutograd's functionalization takes the graph
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.relu_()
        return y + x

    with torch.no_grad():
        c = _compile(f, dynamic=True)
        for n in (3, 5, 9):
            x = torch.randn(n, 2)
            torch.testing.assert_close(c(x), f(x))
    assert direct_calls == []
    assert torchburn.op_coverage()["fallback"] == {}


def test_inference_mode_tensors(toy: Any, direct_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = _MLP().eval()
    with torch.inference_mode():
        x = torch.randn(2, 8)
        torch.testing.assert_close(_compile(model)(x), model(x))
    assert direct_calls == [1]


def test_fallback_nodes_still_run_in_the_direct_graph(toy: Any, direct_calls: list[int]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.relu(x) + 1) * x  # tanh is not a toy kernel

    x = torch.randn(7)
    with torch.no_grad():
        torch.testing.assert_close(_compile(f)(x), f(x))
    assert direct_calls == [1]
    assert "aten.tanh.default" in torchburn.op_coverage()["fallback"]


def test_grad_on_with_nothing_requiring_grad_runs_direct(toy: Any, direct_calls: list[int]) -> None:
    """Grad mode on, but no input requires grad: the graph takes the direct path, and its
    outputs are as eager's (no grad_fn)."""

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ b) + 1

    a, b = torch.randn(4, 5), torch.randn(5, 3)
    got = _compile(f)(a, b)
    torch.testing.assert_close(got, f(a, b))
    assert not got.requires_grad and got.grad_fn is None
    assert direct_calls == [1]


def test_frozen_model_with_grad_on_runs_direct(toy: Any, direct_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = _MLP().requires_grad_(False)
    x = torch.randn(3, 8)
    torch.testing.assert_close(_compile(model)(x), model(x))
    assert direct_calls == [1]


def test_input_requiring_grad_later_recompiles_through_aot(toy: Any, direct_calls: list[int]) -> None:
    """Dynamo guards on each input's requires_grad: the same function called with an input that
    requires grad compiles again, through AOTAutograd, and gradients flow."""

    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.relu(a) * 3

    compiled = _compile(f)
    a = torch.randn(6)
    torch.testing.assert_close(compiled(a), f(a))
    leaf = a.clone().requires_grad_(True)
    out = compiled(leaf)
    assert out.requires_grad
    out.sum().backward()
    assert leaf.grad is not None
    torch.testing.assert_close(leaf.grad, (a > 0).to(a.dtype) * 3)
    assert direct_calls == [1]


def test_tensor_made_with_requires_grad_keeps_its_graph_on_aot(toy: Any, direct_calls: list[int]) -> None:
    """A factory with requires_grad=True: Dynamo passes the new tensor to the next graph as an
    input that requires grad, and that graph goes through AOTAutograd; the output has a
    grad_fn as in eager."""

    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.relu(a) * torch.ones(a.shape, requires_grad=True)

    a = torch.randn(5)
    got, want = _compile(f)(a), f(a)
    torch.testing.assert_close(got, want)
    assert got.requires_grad and want.requires_grad
    assert len(direct_calls) <= 1  # at most the graph before the factory


def test_graph_value_requiring_grad_is_not_eligible_with_grad_on() -> None:
    """Any value in the graph that requires grad (here set on a node's example value by hand,
    since Dynamo breaks the graph at such factories) keeps a grad-on graph on AOTAutograd."""
    gm = torch.fx.symbolic_trace(lambda a: torch.relu(a) * 2)
    a = torch.randn(3)
    for node in gm.graph.nodes:
        node.meta["example_value"] = torch.empty(3)
    assert direct_inference.eligible(gm, [a])
    relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    relu.meta["example_value"] = torch.empty(3, requires_grad=True)
    assert not direct_inference.eligible(gm, [a])
    with torch.no_grad():
        assert direct_inference.eligible(gm, [a])
    assert not direct_inference.eligible(gm, [a.clone().requires_grad_(True)])
