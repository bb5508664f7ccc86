"""tb-core's own decompositions (torchburn.decompositions) against the fused ops they replace:
``nn.TransformerEncoderLayer``'s ``aten._transformer_encoder_layer_fwd`` in float32, in bfloat16,
and under ``torch.autocast``, where eager computes the layer in bfloat16 although the graph types
it float32 (torchburn.autocast_state)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchburn import autocast_state, low_precision_route
from torchburn.backend import decomposition_table

aten = torch.ops.aten
BF16 = torch.bfloat16


def layer(norm_first: bool, activation: str, d: int = 32, heads: int = 4) -> torch.nn.TransformerEncoderLayer:
    torch.manual_seed(0)
    m = torch.nn.TransformerEncoderLayer(
        d, heads, 2 * d, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    with torch.no_grad():  # layer norms that are not the identity
        for p in (m.norm1.weight, m.norm1.bias, m.norm2.weight, m.norm2.bias):
            p.add_(0.3 * torch.randn_like(p))
    return m.eval()


def fused_args(m: torch.nn.TransformerEncoderLayer, src: torch.Tensor) -> tuple[Any, ...]:
    """The arguments nn.TransformerEncoderLayer's fast path passes to the fused op."""
    attn = m.self_attn
    return (
        src,
        attn.embed_dim,
        attn.num_heads,
        attn.in_proj_weight,
        attn.in_proj_bias,
        attn.out_proj.weight,
        attn.out_proj.bias,
        m.activation_relu_or_gelu == 2,
        m.norm_first,
        m.norm1.eps,
        m.norm1.weight,
        m.norm1.bias,
        m.norm2.weight,
        m.norm2.bias,
        m.linear1.weight,
        m.linear1.bias,
        m.linear2.weight,
        m.linear2.bias,
        None,
        None,
    )


def fused(*args: Any) -> torch.Tensor:
    return aten._transformer_encoder_layer_fwd.default(*args)  # type: ignore[no-any-return]


def decomposed(args: tuple[Any, ...], under: dict[str, torch.dtype]) -> torch.fx.GraphModule:
    """The fused op traced with tb-core's table, as if compiled under the autocast state ``under``."""
    with autocast_state.traced_under(under), torch.no_grad():
        return make_fx(fused, decomposition_table=decomposition_table())(*args)


def targets(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


CASES = [(False, "relu"), (True, "relu"), (False, "gelu"), (True, "gelu")]
IDS = ["post-norm-relu", "pre-norm-relu", "post-norm-gelu", "pre-norm-gelu"]


@pytest.mark.parametrize(("norm_first", "activation"), CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=["f32", "bf16"])
def test_encoder_layer_as_eager(norm_first: bool, activation: str, dtype: torch.dtype) -> None:
    m = layer(norm_first, activation).to(dtype)
    src = torch.randn(3, 7, 32).to(dtype)
    args = fused_args(m, src)
    gm = decomposed(args, {})
    assert aten._transformer_encoder_layer_fwd.default not in targets(gm)
    with torch.no_grad():
        expected = fused(*args)
        out = gm(*args)
    assert out.dtype == expected.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 3e-2}
    torch.testing.assert_close(out, expected, **tol)


@pytest.mark.parametrize(("norm_first", "activation"), CASES, ids=IDS)
def test_encoder_layer_under_autocast_as_eager(norm_first: bool, activation: str) -> None:
    """Eager's fused layer under autocast computes in bfloat16 and returns bfloat16; so does the
    decomposition traced under it, and without autocast it stays float32."""
    m = layer(norm_first, activation)
    src = torch.randn(3, 7, 32)
    args = fused_args(m, src)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        expected = fused(*args)
    with torch.no_grad():
        exact = fused(*args)
    assert expected.dtype == BF16

    gm = decomposed(args, {"cpu": BF16})
    casts = [n for n in gm.graph.nodes if n.target is aten._to_copy.default and n.kwargs.get("dtype") == BF16]
    # the input, and each of the four linears' weight and bias
    assert len(casts) >= 9
    addmms = [n for n in gm.graph.nodes if n.target is aten.addmm.default]
    assert len(addmms) == 4 and all(n.meta["val"].dtype == BF16 for n in addmms)
    with torch.no_grad():  # the traced graph holds the casts: it runs without autocast
        out = gm(*args)
    assert out.dtype == BF16
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=3e-2)
    # it computes what eager computes under autocast (mostly the same bits), not the float32
    # layer (which differs from it everywhere by bfloat16 rounding)
    assert (out.float() - expected.float()).abs().mean() < 0.75 * (exact - expected.float()).abs().mean()

    plain = decomposed(args, {})
    assert not [n for n in plain.graph.nodes if n.target is aten._to_copy.default]
    with torch.no_grad():
        torch.testing.assert_close(plain(*args), exact, rtol=1e-5, atol=1e-5)


def test_autocast_for_another_device_or_dtype_changes_nothing() -> None:
    m = layer(False, "relu")
    args = fused_args(m, torch.randn(2, 5, 32))
    for under in ({"cuda": torch.float16}, {"cpu": torch.float32}):
        gm = decomposed(args, under)
        assert aten._to_copy.default not in targets(gm)
    # a bfloat16 layer under autocast is already in autocast's dtype
    low = layer(False, "relu").to(BF16)
    low_args = fused_args(low, torch.randn(2, 5, 32).to(BF16))
    assert aten._to_copy.default not in targets(decomposed(low_args, {"cpu": BF16}))


@pytest.mark.parametrize("autocast", [False, True], ids=["f32", "autocast"])
def test_compiled_layer_as_eager(toy: Any, autocast: bool) -> None:
    """Through torch.compile: under autocast the compiled layer returns eager's bfloat16 (Dynamo's
    graph says float32), and its values are eager's."""
    m = layer(False, "relu")
    x = torch.randn(2, 6, 32)
    ctx = torch.autocast("cpu", dtype=BF16) if autocast else contextlib.nullcontext()
    compiled = torch.compile(m, backend="torchburn", options={"warn": False})
    with torch.no_grad(), ctx:
        expected = m(x)
        out = compiled(x)
    assert out.dtype == expected.dtype == (BF16 if autocast else torch.float32)
    tol = {"rtol": 2e-2, "atol": 3e-2} if autocast else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(out, expected, **tol)


def test_stored_route_decisions_are_per_autocast_state() -> None:
    """The graph as traced means other work under autocast: a decision measured for one state
    is never read for the other."""
    gm = make_fx(lambda x: torch.relu(x) + 1)(torch.randn(4))
    plain = low_precision_route.decision_key(gm, ["tag"])
    with torch.autocast("cpu", dtype=BF16):
        under = low_precision_route.decision_key(gm, ["tag"])
    with torch.autocast("cpu", dtype=torch.float16):
        under16 = low_precision_route.decision_key(gm, ["tag"])
    assert len({plain, under, under16}) == 3
    assert low_precision_route.decision_key(gm, ["tag"]) == plain
