"""torchburn.low_precision: bfloat16 / float16 compute rewritten to float32 between casts.

The pass alone on traced ATen graphs (which nodes change, the casts at eager's rounding points,
every node's ``meta["val"]`` against what the node really computes, idempotence, float32 graphs
untouched) and through ``torch.compile`` with the toy engine, which computes in float32 only.
"""

from __future__ import annotations

import contextlib
import operator
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torchburn
from torchburn.low_precision import LOW, TO_COPY, low_precision_ops, taken_as_is, widen_low_precision
from torchburn.options import Options
from torchburn.testing.models import readme_mlp

aten = torch.ops.aten
LOW_DTYPES = [torch.bfloat16, torch.float16]
IDS = ["bf16", "fp16"]


@pytest.fixture(autouse=True)
def _turned_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_LOW_PRECISION", "1")


def tol(dtype: torch.dtype) -> dict[str, float]:
    """Low-precision tolerances (one or two units in the last place of the result)."""
    return {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 2e-3, "atol": 2e-3}


def traced(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    """``fn`` as an ATen graph whose nodes carry fake ``meta["val"]``, as the backend hands them."""
    return make_fx(fn, tracing_mode="fake", pre_dispatch=False)(*args)


class _Checker(torch.fx.Interpreter):
    """Runs a graph and checks each node's real result against its ``meta["val"]``."""

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if n.op == "output":
            return result
        val = n.meta.get("val")
        pairs = zip(result, val) if isinstance(result, (tuple, list)) else [(result, val)]
        for real, fake in pairs:
            if isinstance(real, torch.Tensor):
                assert isinstance(fake, torch.Tensor), n.name
                assert real.dtype == fake.dtype, f"{n.name}: runs in {real.dtype}, meta says {fake.dtype}"
                assert tuple(real.shape) == tuple(fake.shape), n.name
        return result


def run_checked(gm: torch.fx.GraphModule, *args: Any) -> Any:
    return _Checker(gm).run(*args)


def compute_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target not in (TO_COPY, operator.getitem)]


def dtypes_of(node: torch.fx.Node) -> set[torch.dtype]:
    vals = [a.meta["val"] for a in node.all_input_nodes]
    out = node.meta["val"]
    vals += list(out) if isinstance(out, (tuple, list)) else [out]
    return {v.dtype for v in vals if isinstance(v, torch.Tensor)}


def casts(gm: torch.fx.GraphModule) -> list[tuple[str, torch.dtype, torch.dtype]]:
    """Each cast node: (what it reads, from dtype, to dtype)."""
    out = []
    for n in gm.graph.nodes:
        if n.target is TO_COPY:
            src = n.args[0]
            out.append(
                (str(src.target) if src.op == "call_function" else src.op, src.meta["val"].dtype, n.kwargs["dtype"])
            )
    return out


def mlp_fn(dtype: torch.dtype) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    model, (x,) = readme_mlp(batch=4)
    model = model.to(dtype)
    params = [model.fc1.weight, model.fc1.bias, model.fc2.weight, model.fc2.bias]

    def fn(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2, b2)

    return fn, (x.to(dtype), *[p.detach() for p in params])


# -- the pass alone ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=IDS)
def test_mlp_graph_before_and_after(dtype: torch.dtype) -> None:
    fn, args = mlp_fn(dtype)
    gm = traced(fn, *args)
    before = Counter(str(n.target) for n in compute_nodes(gm))
    assert low_precision_ops(gm.graph.nodes) == Counter({"aten.addmm.default": 2, "aten.relu.default": 1})
    widen_low_precision(gm)
    after = compute_nodes(gm)
    # the same compute ops (views are re-made over the float32 twins), all in float32 now
    assert Counter(str(n.target) for n in after) == before
    for n in after:
        assert dtypes_of(n) == {torch.float32}, n.format_node()
    # a cast of each input before its transpose; relu commutes with rounding, so it reads the
    # first addmm's float32 result and its own result is rounded (and widened back: the
    # rounding pair stays) before the second addmm; the rounding of the output
    assert Counter(casts(gm)) == Counter(
        {
            ("placeholder", dtype, torch.float32): 5,
            ("aten.relu.default", torch.float32, dtype): 1,
            ("aten.addmm.default", torch.float32, dtype): 1,
            ("aten._to_copy.default", dtype, torch.float32): 1,
        }
    )
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    assert relu.args[0].target is torch.ops.aten.addmm.default
    out = run_checked(gm, *args)
    expected = fn(*args)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, **tol(dtype))


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=IDS)
def test_rounds_where_eager_rounds(dtype: torch.dtype) -> None:
    """Two chained rounding ops: the result of the first is rounded to the low dtype before the
    second reads it, so the graph equals eager's op-by-op rounding, not a float32 chain."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 3.0 + 1.0).sigmoid()

    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(dtype)
    gm = widen_low_precision(traced(fn, x))
    rounding = [c for c in casts(gm) if c[2] == dtype]
    assert len(rounding) == 3  # mul, add, sigmoid
    out = run_checked(gm, x)
    # an exact match with eager is expected: each op is one float32 operation, rounded
    torch.testing.assert_close(out, fn(x), rtol=0, atol=0)
    chain = (x.float() * 3.0 + 1.0).sigmoid().to(dtype)
    assert not torch.equal(chain, fn(x)), "the example does not tell rounding points apart"


def conv_block_fn(dtype: torch.dtype, seed: int = 0) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """conv -> inference batch norm -> ReLU6 -> conv -> batch norm -> + x -> relu, in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    c = 8

    def bn() -> list[torch.Tensor]:
        return [
            torch.rand(c, generator=g) + 0.5,
            torch.randn(c, generator=g),
            torch.randn(c, generator=g),
            torch.rand(c, generator=g) + 0.5,
        ]

    args = [
        torch.randn(2, c, 6, 6, generator=g),
        torch.randn(c, c, 3, 3, generator=g) / 8,
        *bn(),
        torch.randn(c, c, 3, 3, generator=g) / 8,
        *bn(),
    ]

    def norm(y: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        # the op an eval-mode BatchNorm2d is in the graphs the backend receives
        return aten._native_batch_norm_legit_no_training(y, w, b, mean, var, 0.1, 1e-5)[0]

    def fn(x: torch.Tensor, w1: torch.Tensor, *p: torch.Tensor) -> torch.Tensor:
        F = torch.nn.functional
        y = F.hardtanh(norm(F.conv2d(x, w1, padding=1), *p[0:4]), 0.0, 6.0)
        y = norm(F.conv2d(y, p[4], padding=1), *p[5:9])
        return torch.relu(y + x)

    return fn, tuple(a.to(dtype) for a in args)


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=IDS)
def test_convolution_epilogue_rounds_once(dtype: torch.dtype) -> None:
    """A convolution's epilogue chain (batch norm, ReLU6, the residual add, relu) reads the
    float32 results before eager's intermediate roundings, so an engine can fold the chain into
    the convolution; the chain's end is rounded once. Closer to the exact value than eager, and
    within the low dtype's tolerance of eager's result."""
    fn, args = conv_block_fn(dtype)
    gm = widen_low_precision(traced(fn, *args))
    bn = aten._native_batch_norm_legit_no_training.default
    nodes = {n.target: n for n in gm.graph.nodes if n.op == "call_function"}
    # nothing between each convolution and its batch norm, the norm and ReLU6, the norm and the add
    norms = [n for n in gm.graph.nodes if n.target is bn]
    assert len(norms) == 2
    assert all(n.args[0].target is aten.convolution.default for n in norms)
    assert nodes[aten.hardtanh.default].args[0].target is operator.getitem
    add = nodes[aten.add.Tensor]
    assert any(a.target is operator.getitem for a in add.args)
    assert nodes[aten.relu.default].args[0] is add
    # rounded to the low dtype: the first chain's end (read by the second convolution) and the output
    assert Counter(c[1:] for c in casts(gm) if c[2] == dtype) == Counter({(torch.float32, dtype): 2})
    out = run_checked(gm, *args)
    expected = fn(*args)
    torch.testing.assert_close(out, expected, **tol(dtype))
    exact = fn(*[a.double() for a in args])
    assert (out.double() - exact).abs().max() <= (expected.double() - exact).abs().max()


def test_hardtanh_rounds_between_when_its_bounds_are_not_low_values() -> None:
    """hardtanh commutes with rounding only when its bounds are values of the low dtype: clamping
    at 0.1 (not a bfloat16) after a rounded product keeps the rounding in between."""

    def clamped(lo: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.hardtanh(x @ w, lo, 6.0)

        return fn

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g).bfloat16(), torch.randn(16, 8, generator=g).bfloat16()
    for lo, between in ((0.0, False), (0.1, True)):
        fn = clamped(lo)
        gm = widen_low_precision(traced(fn, x, w))
        clamp = next(n for n in gm.graph.nodes if n.target is aten.hardtanh.default)
        assert (clamp.args[0].target is TO_COPY) is between, lo
        torch.testing.assert_close(run_checked(gm, x, w), fn(x, w), rtol=0, atol=0)


def test_relu_commutes_through_a_view() -> None:
    """A Linear on a 3-d input is addmm -> view -> relu: the relu reads the same view of the
    float32 product (not the rounded one), so the rounding happens once, after it, and the next
    Linear reads that bfloat16 value (an engine's bfloat16 GEMM takes it as it is)."""
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=g).bfloat16() for s in ((2, 5, 16), (32, 16), (32,), (8, 32), (8,))]

    def fn(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
        F = torch.nn.functional
        return F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)

    gm = widen_low_precision(traced(fn, *args))
    relu = next(n for n in gm.graph.nodes if n.target is aten.relu.default)
    view = relu.args[0]
    assert view.target in (aten.view.default, aten._unsafe_view.default), view.format_node()
    assert view.args[0].target is aten.addmm.default, view.args[0].format_node()
    # relu's rounding, then its float32 twin read by the second addmm; and the output's rounding
    assert Counter(c for c in casts(gm) if c[0] != "placeholder") == Counter(
        {
            ("aten.relu.default", torch.float32, torch.bfloat16): 1,
            ("aten._to_copy.default", torch.bfloat16, torch.float32): 1,
            ("aten.addmm.default", torch.float32, torch.bfloat16): 1,
        }
    )
    torch.testing.assert_close(run_checked(gm, *args), fn(*args), rtol=0, atol=0)  # relu commutes: exact


def test_idempotent_and_float32_untouched() -> None:
    fn, args = mlp_fn(torch.bfloat16)
    gm = widen_low_precision(traced(fn, *args))
    code = gm.code
    assert widen_low_precision(gm).code == code
    fn32, args32 = mlp_fn(torch.float32)
    gm32 = traced(fn32, *args32)
    code32 = gm32.code
    assert low_precision_ops(gm32.graph.nodes) == Counter()
    assert widen_low_precision(gm32) is gm32
    assert gm32.code == code32


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=IDS)
def test_softmax_reductions_norms(dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, mean, rstd = aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
        return (
            aten._softmax(x, -1, False),
            aten._log_softmax(x, 1, False),
            x.sum(-1),
            x.mean(0),
            x.amax(-1),
            out,
            mean,
            rstd,
            x.sum(-1, dtype=torch.float32),  # an explicit compute dtype: the op's own rule
        )

    torch.manual_seed(0)
    x, w, b = torch.randn(6, 33).to(dtype), torch.randn(33).to(dtype), torch.randn(33).to(dtype)
    gm = traced(fn, x, w, b)
    widen_low_precision(gm)
    explicit = [n for n in compute_nodes(gm) if n.kwargs.get("dtype") is not None]
    assert len(explicit) == 1 and explicit[0].all_input_nodes[0].meta["val"].dtype == dtype
    for n in compute_nodes(gm):
        if n not in explicit:
            assert dtypes_of(n) == {torch.float32}, n.format_node()
    outs = run_checked(gm, x, w, b)
    for got, want in zip(outs, fn(x, w, b)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **tol(dtype))


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=IDS)
def test_nan_and_inf_propagate(dtype: torch.dtype) -> None:
    fn, args = mlp_fn(dtype)
    x = args[0].clone()
    x[0, 0], x[1, 3], x[2, 5] = float("nan"), float("inf"), float("-inf")
    gm = widen_low_precision(traced(fn, *args))
    out = run_checked(gm, x, *args[1:])
    expected = fn(x, *args[1:])
    assert out.isnan().any()
    torch.testing.assert_close(out, expected, equal_nan=True, **tol(dtype))

    def act(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).exp() - x.abs()

    special = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -1.5, 100.0]).to(dtype)
    gm2 = widen_low_precision(traced(act, special))
    torch.testing.assert_close(run_checked(gm2, special), act(special), equal_nan=True, **tol(dtype))


def test_mixed_float64_and_integer_nodes_are_left_alone() -> None:
    def fn(x: torch.Tensor, d: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + d, torch.gather(x, 1, i)

    x = torch.randn(4, 8).to(torch.bfloat16)
    d = torch.randn(4, 8, dtype=torch.float64)
    i = torch.randint(0, 8, (4, 3))
    gm = traced(fn, x, d, i)
    code = gm.code
    widen_low_precision(gm)
    assert gm.code == code  # a float64 operand and an indexing op: not this pass's business


def test_existing_casts_are_reused_as_twins() -> None:
    """An autocast-style graph: the float32 value the graph already casts back is the twin."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x.to(torch.bfloat16)
        return h.float() * 2.0, torch.relu(h)

    x = torch.randn(5, 7)
    gm = widen_low_precision(traced(fn, x))
    relu = next(n for n in gm.graph.nodes if n.target is aten.relu.default)
    src = relu.args[0]
    assert src.target is TO_COPY and src.kwargs["dtype"] == torch.float32
    assert sum(1 for c in casts(gm) if c == ("aten._to_copy.default", torch.bfloat16, torch.float32)) == 1
    for got, want in zip(run_checked(gm, x), fn(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


class _Checks:
    """An engine's ``check``: float32 for every op, and ``low`` ops in float16 too."""

    def __init__(self, name: str, low: set[str]) -> None:
        self.name, self.low = name, low

    def check(self, info: Any) -> str | None:
        dtypes = {m.dtype for m in info.inputs}
        if dtypes == {torch.float32} or (dtypes == {torch.float16} and info.op in self.low):
            return None
        return "dtype"


def test_a_node_the_first_engine_takes_as_it_is_is_kept() -> None:
    fn, args = mlp_fn(torch.float16)
    f16_relu = _Checks("f16", {"aten.relu.default"})
    f32_only = _Checks("f32", set())
    for engines, relu_dtype in (([f16_relu], torch.float16), ([f32_only, f16_relu], torch.float32)):
        gm = widen_low_precision(traced(fn, *args), keep=taken_as_is(engines))  # type: ignore[arg-type]
        relu = next(n for n in gm.graph.nodes if n.target is aten.relu.default)
        assert relu.meta["val"].dtype == relu_dtype
        addmms = [n for n in gm.graph.nodes if n.target is aten.addmm.default]
        assert [n.meta["val"].dtype for n in addmms] == [torch.float32] * 2
        torch.testing.assert_close(run_checked(gm, *args), fn(*args), **tol(torch.float16))


# -- through torch.compile ----------------------------------------------------------------------
def compiled_run(model: Any, *args: Any, autocast: bool = False, **options: Any) -> Any:
    compiled = torch.compile(model, backend="torchburn", options={"warn": False, **options})
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        return compiled(*args)


@pytest.fixture
def toy_engine(toy: Any) -> Iterator[Any]:
    yield toy


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=IDS)
def test_low_precision_model_runs_on_a_float32_engine(toy_engine: Any, dtype: torch.dtype, batch: int) -> None:
    model, (x,) = readme_mlp(batch=batch)
    model = model.to(dtype)
    x = x.to(dtype)
    with torch.no_grad():
        expected = model(x)
    out = compiled_run(model, x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, **tol(dtype))
    cov = torchburn.op_coverage()
    assert cov["native"]["aten.addmm.default"] == 2 and cov["native"]["aten.relu.default"] == 1
    # the toy engine has no cast kernel: only the casts are left to eager PyTorch
    assert set(cov["fallback"]) == {"aten._to_copy.default"}
    for plan in toy_engine.compiled_plans:
        for node in plan.nodes:
            metas = [node.out] if isinstance(node.out, torchburn.TensorMeta) else []
            assert all(m.dtype not in LOW for m in metas)


def test_autocast_graph_runs_on_a_float32_engine(toy_engine: Any) -> None:
    model, (x,) = readme_mlp(batch=3)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
    out = compiled_run(model, x, autocast=True)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, **tol(torch.bfloat16))
    cov = torchburn.op_coverage()
    assert cov["native"]["aten.addmm.default"] == 2
    # autocast transposes the float32 weight before casting it: that permute alone is below the
    # toy engine's cost threshold
    assert set(cov["fallback"]) <= {"aten._to_copy.default", "aten.permute.default"}


def test_non_contiguous_input(toy_engine: Any) -> None:
    model, _ = readme_mlp()
    model = model.to(torch.bfloat16)
    x = torch.randn(512, 6).to(torch.bfloat16).t()
    assert not x.is_contiguous()
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(compiled_run(model, x), expected, **tol(torch.bfloat16))


def test_turned_off_by_option_and_environment(toy_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, (x,) = readme_mlp(batch=2)
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    compiled_run(model, x, low_precision=False)
    assert "aten.addmm.default" in torchburn.op_coverage()["fallback"]
    torch._dynamo.reset()
    torchburn.reset_stats()
    monkeypatch.setenv("TORCHBURN_LOW_PRECISION", "0")
    compiled_run(model, x)
    assert "aten.addmm.default" in torchburn.op_coverage()["fallback"]
    torch._dynamo.reset()
    torchburn.reset_stats()
    compiled_run(model, x, low_precision=True)  # the option wins over the environment
    assert "aten.addmm.default" not in torchburn.op_coverage()["fallback"]


def test_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """On unless turned off: an inference graph keeps the rewrite only where it measures faster
    (torchburn.low_precision_route)."""
    monkeypatch.delenv("TORCHBURN_LOW_PRECISION")
    assert Options().widen_low_precision()
    assert not Options(low_precision=False).widen_low_precision()


def test_bad_settings_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="low_precision"):
        Options.from_user({"low_precision": "yes"})
    monkeypatch.setenv("TORCHBURN_LOW_PRECISION", "maybe")
    with pytest.raises(ValueError, match="TORCHBURN_LOW_PRECISION"):
        Options().widen_low_precision()
    monkeypatch.setenv("TORCHBURN_LOW_PRECISION", "off")
    assert not Options().widen_low_precision()
    assert Options(low_precision=True).widen_low_precision()


def test_constants_of_another_fake_mode_do_not_stop_the_pass() -> None:
    """A constant (get_attr, as a model's rotary table) whose fake value is of another fake mode
    than the inputs' (as Dynamo hands some graphs over): the pass still widens every node, typing
    the constant in the inputs' mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    scale = torch.linspace(0.5, 2.0, 16).to(torch.bfloat16)

    def fn(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, w) * s

    x, w = torch.randn(4, 8).to(torch.bfloat16), torch.randn(16, 8).to(torch.bfloat16)
    gm = traced(fn, x, w, scale)
    # the third input becomes a constant of the module, typed by another fake mode
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"][2]
    gm.register_buffer("scale", scale)
    with gm.graph.inserting_before(ph):
        const = gm.graph.get_attr("scale")
    const.meta["val"] = FakeTensorMode().from_tensor(scale)
    ph.replace_all_uses_with(const)
    gm.graph.erase_node(ph)
    gm.recompile()
    widen_low_precision(gm)
    for n in compute_nodes(gm):
        assert dtypes_of(n) == {torch.float32}, n.format_node()
    torch.testing.assert_close(gm(x, w), fn(x, w, scale), **tol(torch.bfloat16))
