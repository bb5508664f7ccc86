"""What cython_dispatch reports: every node it takes runs PyTorch's own kernel, so telemetry counts
it as "delegated", never as "native" (torchburn.op_coverage, explain, torchburn ops)."""

from __future__ import annotations

import json

import pytest
import torch

import torchburn

# a kernel pack installed beside this package (the example engine adds a gelu) would change the counts
pytestmark = pytest.mark.usefixtures("only_this_package")


def _layer_norm_step() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch._dynamo.reset()
    torchburn.reset_stats()
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    x = torch.randn(4, 16, requires_grad=True)
    compiled = torch.compile(norm, backend="torchburn", options={"engine": "cython_dispatch", "warn": False})
    compiled(x).square().sum().backward()
    assert x.grad is not None and norm.weight.grad is not None
    x_ref = x.detach().clone().requires_grad_(True)
    norm.zero_grad()
    norm(x_ref).square().sum().backward()
    return x.grad, x_ref.grad, norm.weight.grad  # type: ignore[return-value]


def test_layer_norm_backward_is_delegated_not_native() -> None:
    grad, want, _ = _layer_norm_step()
    torch.testing.assert_close(grad, want)
    cov = torchburn.op_coverage()
    backward = "aten.native_layer_norm_backward.default"
    assert backward not in cov["native"], cov
    assert cov["delegated"].get(backward, 0) >= 1, cov
    assert cov["delegated"].get("aten.native_layer_norm.default", 0) >= 1
    assert cov["native"] == {}  # cython_dispatch implements no kernel itself
    by_engine = torchburn.op_coverage(by_engine=True)
    assert f"cython_dispatch:{backward}" in by_engine["delegated"]


def test_explain_says_what_cython_dispatch_delegates() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (8,)).relu()

    x = torch.randn(3, 8)
    explanation = torchburn.explain(f, x, options={"engine": "cython_dispatch"})
    torch.testing.assert_close(explanation.output, f(x))
    assert not explanation.native_ops and not explanation.fully_native
    assert explanation.delegated_ops["aten.native_layer_norm.default"] == 1
    assert "delegated to PyTorch's kernels by cython_dispatch" in str(explanation)


def test_torchburn_ops_shows_cython_dispatch_as_delegating(capsys: pytest.CaptureFixture[str]) -> None:
    from torchburn.cli import main

    assert main(["ops", "--format", "json", "--engine", "cython_dispatch"]) == 0
    rows = json.loads(capsys.readouterr().out)["ops"]
    assert rows and all(r["cython_dispatch"] is False and r["delegated"] == ["cython_dispatch"] for r in rows)
