"""A CNN training step (forward, loss, backward, optimizer step) through
``torch.compile(backend="torchburn")``: the parameters after several SGD steps equal eager's, and
no op of the forward or the backward graph falls back to eager (the convolution backward, the
batch norm training forward and backward, the pooling backward run in native_cpu's kernels)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import ENGINES
from torch import nn

import torchburn

pytestmark = pytest.mark.skipif("native_cpu" not in ENGINES, reason="needs the native_cpu engine (tb-cpu-rust)")


def _conv_bn(cin: int, cout: int, k: int, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, 1, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


class CNN(nn.Module):
    """The bench CNN (benchmarks/bench_models.py): conv-BN-ReLU-pool twice and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_bn(3, 32, 3), nn.ReLU(), nn.MaxPool2d(2), *_conv_bn(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class MobileNetish(nn.Module):
    """1x1 expand, 3x3 depthwise, 1x1 project with biases, a residual, a strided grouped conv."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(8, 32, 1), nn.BatchNorm2d(32), nn.ReLU6(), nn.Conv2d(32, 32, 3, padding=1, groups=32),
            nn.BatchNorm2d(32), nn.ReLU6(), nn.Conv2d(32, 8, 1),
        )  # fmt: skip
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=2, dilation=2, groups=2)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(torch.relu(self.body(x) + x))
        return self.head(y.mean((2, 3)))


def _named(name: str) -> Callable[[str], str]:
    return lambda m: f"{name}: {m}"


def _train(
    make: Callable[[], nn.Module], x: torch.Tensor, t: torch.Tensor, wrap: Callable[[nn.Module], Any] | None,
    steps: int, memory_format: torch.memory_format,
) -> nn.Module:  # fmt: skip
    torch.manual_seed(0)
    model = make().to(memory_format=memory_format)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run = wrap(model) if wrap is not None else model
    x = x.to(memory_format=memory_format)
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(run(x), t)
        loss.backward()
        opt.step()
    return model


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
@pytest.mark.parametrize(
    ("make", "x_shape", "classes"), [(CNN, (8, 3, 32, 32), 10), (MobileNetish, (4, 8, 12, 12), 5)], ids=["cnn", "mbv2"]
)
def test_cnn_training_matches_eager_without_fallback(
    make: Callable[[], nn.Module], x_shape: tuple[int, ...], classes: int, memory_format: torch.memory_format
) -> None:
    g = torch.Generator().manual_seed(1)
    x, t = torch.randn(x_shape, generator=g), torch.randint(0, classes, (x_shape[0],), generator=g)
    eager = _train(make, x, t, None, 4, memory_format)
    torchburn.reset_stats()
    compiled = _train(make, x, t, lambda m: torch.compile(m, backend="torchburn"), 4, memory_format)
    cov = torchburn.op_coverage()
    assert not cov["fallback"], cov["fallback"]
    assert cov["native"].get("aten.convolution_backward.default", 0) > 0, cov
    assert "aten.convolution_backward.default" not in cov["delegated"], cov
    for (name, a), b in zip(compiled.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4, msg=_named(name))
