"""tb-core's common-subexpression pass, and that the torchburn path imports nothing of inductor."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchburn.cse import eliminate_common_subexpressions

aten = torch.ops.aten


def _calls(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _cse(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    gm = make_fx(fn)(*args)
    new = torch.fx.GraphModule(gm, eliminate_common_subexpressions(gm.graph))
    return gm, new


def test_repeated_pure_calls_merge_and_the_result_is_unchanged() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        a = torch.sin(x) + torch.sin(x)
        b = (x @ y) * (x @ y)
        return a, b, torch.sum(a, dim=1) - torch.sum(a, dim=1)

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    old, new = _cse(fn, x, y)
    assert _calls(old).count(aten.sin.default) == 2 and _calls(new).count(aten.sin.default) == 1
    assert _calls(new).count(aten.mm.default) == 1
    assert _calls(new).count(aten.sum.dim_IntList) == 1
    torch.testing.assert_close(new(x, y), fn(x, y), rtol=0, atol=0)


def test_returned_nodes_keep_their_own_storage() -> None:
    def fn(x: torch.Tensor) -> Any:
        return torch.relu(x).view(-1), torch.relu(x)

    x = torch.randn(3, 4)
    _, new = _cse(fn, x)
    assert _calls(new).count(aten.relu.default) == 2
    a, b = new(x)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


def test_literals_are_compared_exactly() -> None:
    def fn(x: torch.Tensor) -> Any:
        return x * 0.0, x * -0.0, x * float("nan"), x * float("nan"), torch.pow(x, 1), torch.pow(x, True)

    x = torch.randn(3)
    old, new = _cse(fn, x)
    assert _calls(new).count(aten.mul.Tensor) == _calls(old).count(aten.mul.Tensor)
    assert len(_calls(new)) == len(_calls(old))
    got, want = new(x), fn(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    assert torch.signbit(got[1]).tolist() == torch.signbit(want[1]).tolist()


def test_random_and_mutating_calls_are_kept() -> None:
    def fn(x: torch.Tensor) -> Any:
        noise = torch.rand_like(x) + torch.rand_like(x)
        y = x.clone()
        y.add_(1)
        y.add_(1)
        return noise, y

    x = torch.zeros(1000)
    old, new = _cse(fn, x)
    assert _calls(new).count(aten.rand_like.default) == 2
    assert _calls(new).count(aten.add_.Tensor) == _calls(old).count(aten.add_.Tensor) == 2
    noise, y = new(x)
    assert noise.unique().numel() > 100  # two independent draws, not one doubled
    torch.testing.assert_close(y, torch.full_like(x, 2.0))


def test_compiling_imports_no_more_of_inductor_than_dynamo_itself() -> None:
    code = """
        import json, sys, torch
        import torch._dynamo

        def inductor():
            return {m for m in sys.modules if m.startswith("torch._inductor")}

        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
        x = torch.randn(4, 16)
        # Dynamo's own cost, with a backend that runs the graph as it is
        torch.compile(model, backend="eager")(x)
        dynamo = inductor()
        torch._dynamo.reset()
        import torchburn
        with torch.no_grad():
            out = torch.compile(model, backend="torchburn")(x)
        torch.testing.assert_close(out, model(x))
        print(json.dumps(sorted(inductor() - dynamo)))
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    extra = json.loads(out.stdout.strip().splitlines()[-1])
    # make_fx itself (torch's tracer, not ours) imports this one pass module
    assert set(extra) <= {"torch._inductor.fx_passes", "torch._inductor.fx_passes.dedupe_symint_uses"}, extra
