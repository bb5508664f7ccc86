"""Partitioning across engines: only accepted nodes, cost threshold, priority, and failures."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import torchburn
from torchburn.plan import GETITEM
from torchburn.testing.models import MODELS


def mlp_gelu() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.GELU())
    return m.eval(), torch.randn(4, 16)


def run(model: Any, *args: Any, **options: Any) -> Any:
    with torch.no_grad():
        return torch.compile(model, backend="torchburn", options=options)(*args)


def test_engine_only_gets_nodes_it_accepts(toy: Any) -> None:
    from conftest import TOY_OPS

    model, x = mlp_gelu()
    torch.testing.assert_close(run(model, x), model(x))
    assert toy.compiled_plans, "the toy engine compiled nothing"
    for plan in toy.compiled_plans:
        assert set(plan.ops()) - {GETITEM} <= set(TOY_OPS)
    cov = torchburn.op_coverage()
    assert cov["native"]["aten.addmm.default"] == 2
    assert cov["fallback"] == {"aten.gelu.default": 1}
    assert torchburn.active_engine() == "toy"


def test_one_bounded_warning_per_fallback_op(toy: Any) -> None:
    model, x = mlp_gelu()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(model, x)
        torch._dynamo.reset()
        run(model, x)
    gelu = [w for w in caught if "aten.gelu.default runs in eager" in str(w.message)]
    assert len(gelu) == 1


def test_small_partitions_stay_eager_with_a_reason(toy: Any) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.tanh(x))  # one accepted op between unsupported ones

    x = torch.randn(8)
    explanation = torchburn.explain(f, x)
    torch.testing.assert_close(explanation.output, f(x))
    reasons = explanation.fallback_reasons
    assert any("below cost threshold" in r for r in reasons["aten.sigmoid.default"])
    assert "no kernel" in " ".join(reasons["aten.tanh.default"])
    explanation = torchburn.explain(f, x, options={"min_partition_size": 1})
    assert explanation.native_ops["aten.sigmoid.default"] == 1


def test_one_large_elementwise_op_is_worth_a_partition(toy: Any) -> None:
    """The threshold counts work, not only ops: one sigmoid over 128k elements goes to the
    engine; over 8 elements, or with the work rule off, it stays eager with the numbers."""
    big, tiny = torch.randn(512, 256), torch.randn(8)
    explanation = torchburn.explain(torch.sigmoid, big)
    assert explanation.native_ops["aten.sigmoid.default"] == 1
    torch.testing.assert_close(explanation.output, torch.sigmoid(big))
    torch._dynamo.reset()
    reasons = torchburn.explain(torch.sigmoid, tiny).fallback_reasons["aten.sigmoid.default"]
    assert any("8 elements written < min_partition_work=65536" in r for r in reasons), reasons
    torch._dynamo.reset()
    off = torchburn.explain(torch.sigmoid, big, options={"min_partition_work": 0})
    assert "aten.sigmoid.default" in off.fallback_reasons
    torch._dynamo.reset()
    at = torchburn.explain(torch.sigmoid, tiny, options={"min_partition_work": 8})
    assert at.native_ops["aten.sigmoid.default"] == 1
    with pytest.raises(ValueError, match="min_partition_work must be 0 or more"):
        torchburn.Options.from_user({"min_partition_work": -1})
    with pytest.raises(ValueError, match="min_partition_work must be an int"):
        torchburn.Options.from_user({"min_partition_work": 1.5})


def test_views_alone_go_to_the_engine_only_at_threshold_zero(toy: Any) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.permute(1, 0)  # a graph of one view: nothing to compute

    x = torch.randn(3, 5)
    explanation = torchburn.explain(f, x, options={"min_partition_size": 1})
    assert any("below cost threshold" in r for r in explanation.fallback_reasons["aten.permute.default"])
    explanation = torchburn.explain(f, x, options={"min_partition_size": 0})
    assert explanation.native_ops["aten.permute.default"] == 1
    assert not explanation.fallback_reasons
    torch.testing.assert_close(explanation.output, f(x))


def test_negative_threshold_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="min_partition_size must be 0 or more"):
        torchburn.Options.from_user({"min_partition_size": -1})


def test_heavy_op_alone_is_worth_a_partition(toy: Any) -> None:
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.addmm(b, x, w))

    args = (torch.randn(4, 5), torch.randn(5, 3), torch.randn(3))
    explanation = torchburn.explain(f, *args)
    assert explanation.native_ops["aten.addmm.default"] == 1


def test_no_cycles_when_a_fallback_sits_between_accepted_nodes(toy: Any) -> None:
    # add -> tanh (fallback) -> mul(add_out, tanh_out): merging add and mul into one partition
    # would need tanh's output before the partition starts: a cycle.
    def f(x: torch.Tensor) -> torch.Tensor:
        a = x + 1
        return (a * torch.tanh(a)) + a

    x = torch.randn(6)
    explanation = torchburn.explain(f, x, options={"min_partition_size": 1})
    torch.testing.assert_close(explanation.output, f(x))


def test_priority_list_uses_second_engine_for_the_rest(toy: Any) -> None:
    class Second(torchburn.Engine):
        name = "second"

    class SecondPlugin:
        @torchburn.hookimpl
        def tb_register_engines(self) -> list[Any]:
            return [Second]

        @torchburn.hookimpl
        def tb_register_kernels(self, registry: torchburn.KernelRegistry) -> None:
            registry.register("second", "aten.gelu.default", torch.ops.aten.gelu.default, torchburn.accepts())
            registry.register("second", "aten.relu.default", torch.ops.aten.relu.default, torchburn.accepts())

    torchburn.register_plugin(SecondPlugin(), "second-plugin")
    model, x = mlp_gelu()
    torchburn.reset_stats()
    explanation = torchburn.explain(model, x, options={"engine": "toy,second", "min_partition_size": 1})
    torch.testing.assert_close(explanation.output, model(x))
    engines = {p.engine for g in explanation.graphs for p in g.partitions}
    assert engines == {"toy", "second"}
    gelu_partitions = [p for g in explanation.graphs for p in g.partitions if "aten.gelu.default" in p.ops]
    assert [p.engine for p in gelu_partitions] == ["second"]
    relu_partitions = [p for g in explanation.graphs for p in g.partitions if "aten.relu.default" in p.ops]
    assert [p.engine for p in relu_partitions] == ["toy"]  # first in priority order wins
    cov = torchburn.op_coverage(by_engine=True)["native"]
    assert cov["second:aten.gelu.default"] >= 1


def test_env_selects_engines(toy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_ENGINE", "eager")
    assert torchburn.active_engine() == "eager"
    monkeypatch.setenv("TORCHBURN_ENGINE", "toy")
    assert torchburn.active_engines() == ["toy"]
    monkeypatch.setenv("TORCHBURN_ENGINE", "nope")
    with pytest.raises(torchburn.EngineNotFoundError, match="no engine named 'nope'"):
        torchburn.active_engine()
    monkeypatch.delenv("TORCHBURN_ENGINE")
    monkeypatch.setenv("TORCHBURN_DEVICE", "gpu")
    assert torchburn.active_engines() == []


def test_compile_failure_falls_back_with_warning(toy: Any) -> None:
    toy.fail_compile = True
    model, x = mlp_gelu()
    with pytest.warns(torchburn.TorchburnFallbackWarning, match="failed to compile"):
        out = run(model, x)
    torch.testing.assert_close(out, model(x))
    assert torchburn.op_coverage()["native"] == {}


def test_run_failure_falls_back_with_warning(toy: Any) -> None:
    toy.fail_run = True
    model, x = mlp_gelu()
    compiled = torch.compile(model, backend="torchburn")
    with torch.no_grad(), pytest.warns(torchburn.TorchburnFallbackWarning, match="failed while running"):
        out = compiled(x)
    torch.testing.assert_close(out, model(x))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # stays on the eager path


class NativePanic(BaseException):
    """What a Rust panic looks like from Python (pyo3's PanicException derives from BaseException)."""


def test_native_panic_while_running_falls_back_too(toy: Any) -> None:
    toy.fail_run = NativePanic
    model, x = mlp_gelu()
    compiled = torch.compile(model, backend="torchburn")
    with torch.no_grad(), pytest.warns(torchburn.TorchburnFallbackWarning, match="NativePanic"):
        out = compiled(x)
    torch.testing.assert_close(out, model(x))


def test_keyboard_interrupt_in_a_partition_is_not_swallowed(toy: Any) -> None:
    toy.fail_run = KeyboardInterrupt
    model, x = mlp_gelu()
    with torch.no_grad(), pytest.raises(KeyboardInterrupt):
        torch.compile(model, backend="torchburn")(x)


def test_strict_mode_raises_engine_errors(toy: Any) -> None:
    toy.fail_compile = True
    model, x = mlp_gelu()
    with pytest.raises(Exception, match="toy compile failure"):
        run(model, x, fallback="error")


def test_model_set_with_toy_engine(toy: Any) -> None:
    for name in ("readme_mlp", "small_cnn", "transformer_layer"):
        model, args = MODELS[name]()
        torch.testing.assert_close(run(model, *args), model(*args), rtol=1e-4, atol=1e-4)


def test_training_graphs_partitioned(toy: Any) -> None:
    model, x = mlp_gelu()
    model.train()
    compiled = torch.compile(model, backend="torchburn")
    compiled(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    torch._dynamo.reset()
    sink: list[Any] = []
    compiled = torch.compile(model, backend="torchburn", options={"report_sink": sink})
    compiled(x).sum().backward()
    kinds = {report.kind: report for report in sink}
    assert set(kinds) == {"forward", "backward"}
    assert kinds["forward"].native_ops()["aten.addmm.default"] == 2
