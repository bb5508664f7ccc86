"""The tb-core model set: small real models every engine must match eager on.

Each factory returns ``(model, example_args)`` with fixed seeds, in eval mode unless asked
otherwise. The tiny causal LM needs ``transformers`` and is built from a config with random
weights (nothing is downloaded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class ReadmeMLP(nn.Module):
    """The README model: 512 -> 1024 -> ReLU -> 256."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(512, 1024)
        self.fc2 = nn.Linear(1024, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class TrainMLP(nn.Module):
    """784 -> 512 -> 10, the training benchmark model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def readme_mlp(batch: int = 32) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return ReadmeMLP().eval(), (torch.randn(batch, 512),)


def small_cnn(batch: int = 4) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    model = SmallCNN()
    # Non-trivial running statistics, so inference-mode batch norm is really exercised.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval(), (torch.randn(batch, 3, 16, 16),)


def transformer_layer(batch: int = 2, seq: int = 16) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return layer.eval(), (torch.randn(batch, seq, 64),)


def tiny_causal_lm(seq: int = 12) -> tuple[nn.Module, tuple[Any, ...]]:
    """A 2-layer Llama from a tiny config with random weights (needs transformers)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",  # type: ignore[call-arg]
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, seq))

    class LogitsOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=input_ids, use_cache=False).logits  # type: ignore[no-any-return]

    return LogitsOnly().eval(), (ids,)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[Any, ...]]]] = {
    "readme_mlp": readme_mlp,
    "small_cnn": small_cnn,
    "transformer_layer": transformer_layer,
    "tiny_causal_lm": tiny_causal_lm,
}


def train_losses(
    compile_fn: Callable[[nn.Module], Callable[..., Any]] | None,
    steps: int = 20,
    batch: int = 64,
    seed: int = 0,
) -> list[float]:
    """Losses of ``steps`` Adam steps on TrainMLP with synthetic data; eager when compile_fn is None."""
    torch.manual_seed(seed)
    model = TrainMLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = compile_fn(model) if compile_fn is not None else model
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        x = torch.randn(batch, 784, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(run(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
