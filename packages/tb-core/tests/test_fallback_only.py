"""With only tb-core installed every op falls back, and results equal eager."""

from __future__ import annotations

import pytest
import torch

import torchburn
from torchburn.testing.models import MODELS, train_losses


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_set_matches_eager_with_no_engine(name: str) -> None:
    if name == "tiny_causal_lm":
        pytest.importorskip("transformers", reason="the tiny causal LM is built with transformers")
    model, args = MODELS[name]()
    with torch.no_grad():
        expected = model(*args)
        actual = torch.compile(model, backend="torchburn")(*args)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    coverage = torchburn.op_coverage()
    assert coverage["native"] == {}
    assert sum(coverage["fallback"].values()) > 0
    assert torchburn.active_engine() == "eager"


def test_training_20_steps_adam_matches_eager() -> None:
    eager = train_losses(None, steps=20)
    compiled = train_losses(lambda m: torch.compile(m, backend="torchburn"), steps=20)
    assert len(compiled) == 20
    assert max(abs(a - b) for a, b in zip(eager, compiled)) <= 1e-5
    fallback = torchburn.op_coverage()["fallback"]
    # forward and backward graphs both ran
    assert "aten.addmm.default" in fallback and "aten.threshold_backward.default" in fallback


def test_dynamic_shapes_never_raise() -> None:
    model, _ = MODELS["readme_mlp"]()
    compiled = torch.compile(model, backend="torchburn", dynamic=True)
    with torch.no_grad():
        for batch in (3, 5, 9):
            xb = torch.randn(batch, 512)
            torch.testing.assert_close(compiled(xb), model(xb), rtol=1e-4, atol=1e-4)


def test_backend_works_through_entry_point_without_import() -> None:
    import subprocess
    import sys

    code = (
        "import torch, sys\n"
        "m = torch.nn.Linear(4, 3)\n"
        "x = torch.randn(2, 4)\n"
        "y = torch.compile(m, backend='torchburn')(x)\n"
        "torch.testing.assert_close(y, m(x))\n"
        "print('torchburn' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"  # Dynamo imported it through the entry point


def test_unknown_option_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="unknown torchburn option"):
        torchburn.Options.from_user({"engin": "x"})


def test_llm_alias_says_what_to_install() -> None:
    import importlib.util

    if importlib.util.find_spec("tb_llm") is not None:
        import tb_llm

        assert torchburn.LLM is tb_llm.LLM
        return
    with pytest.raises(ImportError, match="pip install tb-llm"):
        _ = torchburn.LLM


def test_import_is_cheap() -> None:
    import subprocess
    import sys

    code = "import sys, torchburn; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "import torchburn must not import torch._dynamo (seconds of start-up)"
