"""transformers models from small configs with random weights, on every engine: inference + training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import ENGINES

import torchburn

transformers = pytest.importorskip("transformers", reason="the transformers model set needs transformers")


def bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertModel(cfg, add_pooling_layer=False)


def gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(
        vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    return transformers.GPT2LMHeadModel(cfg)


def llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(cfg)


def qwen2() -> torch.nn.Module:
    cfg = transformers.Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(cfg)


MODELS: dict[str, Callable[[], torch.nn.Module]] = {"bert": bert, "gpt2": gpt2, "llama": llama, "qwen2": qwen2}


class Head(torch.nn.Module):
    """Tensor in, tensor out: the model's main output for given token ids."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = (
            self.model(input_ids=ids, use_cache=False)
            if not isinstance(self.model, transformers.BertModel)
            else self.model(input_ids=ids)
        )
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Head(MODELS[name]())
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(1))
    return model, ids


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_matches_eager(engine: str, name: str) -> None:
    model, ids = build(name)
    model.eval()
    with torch.no_grad():
        expected = model(ids)
        actual = torch.compile(model, backend="torchburn", options={"engine": engine})(ids)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    cov = torchburn.op_coverage()  # delegated: taken by the engine, run by PyTorch's kernel (cython_dispatch)
    assert cov["native"] or cov["delegated"], f"no op ran in {engine}"


def train(model: torch.nn.Module, ids: torch.Tensor, run: Any, steps: int = 3) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = run(ids).float().pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_short_training_matches_eager(engine: str, name: str) -> None:
    model, ids = build(name)
    model.train()
    eager = train(model, ids, model)
    model, ids = build(name)
    model.train()
    compiled = train(model, ids, torch.compile(model, backend="torchburn", options={"engine": engine}))
    assert max(abs(a - b) for a, b in zip(eager, compiled)) <= 1e-4, (eager, compiled)
