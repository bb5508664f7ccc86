"""igamma / igammac (regularized incomplete gamma) against PyTorch, edge cases included."""

from __future__ import annotations

import pytest
import torch

from torchburn.testing.conformance import compile_with, native_and_fallback


@pytest.mark.parametrize("fn", [torch.special.gammainc, torch.special.gammaincc])
def test_igamma_matches_torch(fn: object) -> None:
    a = torch.tensor([0.05, 0.5, 1.0, 2.5, 7.0, 30.0, 150.0])[:, None]
    x = torch.tensor([0.0, 1e-3, 0.3, 1.0, 2.0, 6.5, 29.0, 31.0, 160.0, 400.0])[None, :]
    edge_a = torch.tensor([-1.0, 0.0, 0.0, 2.0, float("inf"), float("inf"), 3.0, float("nan")])
    edge_x = torch.tensor([1.0, 2.0, 0.0, -1.0, 3.0, float("inf"), float("inf"), 1.0])
    compiled, reports = compile_with("native_cpu", fn, cache=False)
    with torch.no_grad():
        got, got_edge = compiled(a, x), compiled(edge_a, edge_x)
    _, fallback = native_and_fallback(reports)
    assert not fallback, fallback
    torch.testing.assert_close(got, fn(a, x), rtol=1e-4, atol=1e-5)  # type: ignore[operator]
    torch.testing.assert_close(got_edge, fn(edge_a, edge_x), equal_nan=True)  # type: ignore[operator]
