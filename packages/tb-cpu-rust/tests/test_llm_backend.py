"""The native_cpu LLM backend's kernels against tb-core's reference math and float64 products
(tb-core and torch only; whole checkpoints through tb-llm: integration_tests/test_llm_native_cpu.py).
The conformance suite (test_llm_conformance.py) covers the protocol; these go deeper into the
native kernels' shapes, row counts and error bounds."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native
from tb_cpu_rust.llm import NativeLLMBackend, _arg
from torchburn.llm import (
    Activation,
    DeclinedWeight,
    KVCache,
    ModelDescription,
    QuantWeight,
    ReferenceKernels,
    forward,
    quantize,
    reference,
)
from torchburn.testing.llm_conformance import MODEL_SPECS, ModelSpec, random_model

BE = NativeLLMBackend()


def _linear_ref(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    # float64 on the exactly dequantized weight: what every layout promises
    y = x.double() @ w.dequantize(torch.float64).T
    return (y if bias is None else y + bias.double()).float()


def _check_quant(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w: QuantWeight) -> None:
    """int8 activations, one scale per 32-value block: each x_k moves by at most half a step,
    amax(block) / 254, so |error| <= sum_k |w_k| amax(block(k)) / 254 (plus f32 rounding)."""
    k = x.shape[1]
    pad = (-k) % 32
    xb = F.pad(x.abs(), (0, pad)).reshape(x.shape[0], -1, 32).amax(-1)
    step = xb.repeat_interleave(32, dim=1)[:, :k] / 254
    bound = step.double() @ w.dequantize(torch.float64).abs().T
    tol = bound.float() * 1.001 + 1e-5 * (x.abs().double() @ w.dequantize(torch.float64).abs().T).float() + 1e-6
    assert ((got - want).abs() <= tol).all(), float(((got - want).abs() - tol).max())
    torch.testing.assert_close(got, want, rtol=0, atol=float(tol.max()))


# -- linear ---------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [1, 2, 5, 12])
@pytest.mark.parametrize(("n", "k"), [(1, 32), (7, 33), (13, 160), (129, 384), (300, 896), (37, 1000)])
def test_int8_linear(m: int, n: int, k: int) -> None:
    torch.manual_seed(n * k + m)
    w = quantize(torch.randn(n, k), "int8")
    x = torch.randn(m, k)
    _check_quant(BE.linear(x, BE.prepare_linear(w), None), _linear_ref(x, w), x, w)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 3, 12])
@pytest.mark.parametrize(("n", "k"), [(1, 128), (7, 384), (33, 896), (300, 1152)])
def test_int4_linear(group: int, m: int, n: int, k: int) -> None:
    torch.manual_seed(n + k + group + m)
    w = quantize(torch.randn(n, k), "int4", group)
    assert w.kind == "int4"
    x = torch.randn(m, k)
    _check_quant(BE.linear(x, BE.prepare_linear(w), None), _linear_ref(x, w), x, w)


@pytest.mark.parametrize("kind", ["fp32", "bf16"])
@pytest.mark.parametrize("m", [1, 4, 9])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (37, 131), (300, 896)])
def test_dense_linear_with_bias(kind: str, m: int, n: int, k: int) -> None:
    torch.manual_seed(m + n + k)
    w = quantize(torch.randn(n, k), kind)
    x, bias = torch.randn(m, k), torch.randn(n)
    got = BE.linear(x, BE.prepare_linear(w), bias)
    torch.testing.assert_close(got, _linear_ref(x, w, bias), rtol=1e-4, atol=1e-4 * k**0.5)


def test_quantized_linear_with_bias() -> None:
    w = quantize(torch.randn(20, 256), "int4", 64)
    x, bias = torch.randn(2, 256), torch.randn(20)
    _check_quant(BE.linear(x, BE.prepare_linear(w), bias), _linear_ref(x, w, bias), x, w)


@pytest.mark.parametrize("kind", ["int4", "int8", "bf16", "fp32"])
@pytest.mark.parametrize("m", [1, 3, 7, 15, 16, 17, 512])
@pytest.mark.parametrize(("n", "k"), [(37, 96), (70, 4864)])
def test_prefill_row_counts_against_dequantized(kind: str, m: int, n: int, k: int) -> None:
    """Prefill-sized inputs: from 16 rows on fp32 / bf16 / int8 run the panel GEMM (f32
    activations on the exactly dequantized weight), so only f32 rounding of K-long sums
    separates it from the float64 product: |error| <= ~K * 2^-24 * sum|x w| worst case,
    ~sqrt(K) * 2^-24 typical (the 1e-5 relative bound covers K = 4864 with margin). Where the
    CPU has AMX tiles (`llm_prefill_tiles()`), bf16 / int8 / int4 take them from 16 rows on,
    and without tiles where it has AVX-512 BF16, the pair kernel (`llm_prefill_bf16_pairs()`;
    K even, int4 K a multiple of 32): the same bound against the product of the bf16-rounded
    activations (and, int4, the bf16-rounded dequantized weight). int4 below 16 rows (any row
    count without tiles or pairs), and
    int8 below 16 rows, meet int8 activations (as llama.cpp's Q4_0 x Q8_0): the bound of
    `_check_quant`. Exact agreement of the batched int4 / int8 loops with the per-row GEMV is
    checked bit for bit in Rust (`qgemm::tests`)."""
    torch.manual_seed(m * 7 + n + k)
    w = quantize(torch.randn(n, k) * 0.05, kind, 32)
    x, bias = torch.randn(m, k), torch.randn(n)
    got = BE.linear(x, BE.prepare_linear(w), bias)
    tiles = _native.llm_prefill_tiles() and m >= 16 and kind != "fp32" and k % 32 == 0
    pairs = _native.llm_prefill_bf16_pairs() and m >= 16 and kind != "fp32" and k % (32 if kind == "int4" else 2) == 0
    if tiles or pairs:
        xr = x.to(torch.bfloat16).double()
        wd = w.dequantize(torch.float64)
        if kind == "int4":
            wd = wd.float().to(torch.bfloat16).double()
        want = (xr @ wd.T + bias.double()).float()
        mag = (xr.abs() @ wd.abs().T).float() + bias.abs()
        assert ((got - want).abs() <= 1e-5 * mag + 1e-6).all(), float(((got - want).abs() / mag).max())
        return
    want = _linear_ref(x, w, bias)
    if (m >= 16 and kind != "int4") or kind in ("bf16", "fp32"):
        mag = (x.abs().double() @ w.dequantize(torch.float64).abs().T).float() + bias.abs()
        assert ((got - want).abs() <= 1e-5 * mag + 1e-6).all(), float(((got - want).abs() / mag).max())
    else:
        _check_quant(got, want, x, w)


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_prefill_switches_give_f32_activations_back(kind: str) -> None:
    """`llm_prefill_tiles(False)` and `llm_prefill_bf16_pairs(False)` put bf16 / int8 prefill
    back on f32 activations (the exact bound), and each switch reports the previous setting."""
    w = quantize(torch.randn(40, 256) * 0.05, kind)
    x = torch.randn(32, 256)
    handle = BE.prepare_linear(w)
    was_tiles = _native.llm_prefill_tiles(False)
    was_pairs = _native.llm_prefill_bf16_pairs(False)
    try:
        assert _native.llm_prefill_tiles() is False
        assert _native.llm_prefill_bf16_pairs() is False
        got = BE.linear(x, handle, None)
    finally:
        _native.llm_prefill_tiles(was_tiles)
        _native.llm_prefill_bf16_pairs(was_pairs)
    assert _native.llm_prefill_tiles() is was_tiles
    assert _native.llm_prefill_bf16_pairs() is was_pairs
    want = _linear_ref(x, w)
    mag = (x.abs().double() @ w.dequantize(torch.float64).abs().T).float()
    assert ((got - want).abs() <= 1e-5 * mag + 1e-6).all()


@pytest.mark.parametrize("m", [16, 130])
def test_prefill_engine_gemm_switch_agrees_with_the_panel_gemm(m: int) -> None:
    """fp32 prefill on the engine's own float32 GEMM (the default where it is the backend) and on
    the panel GEMM (`llm_prefill_engine_gemm(False)`): both within the exact-f32 bound of the
    float64 product, and the switch reports the previous setting."""
    torch.manual_seed(m)
    w = quantize(torch.randn(300, 896) * 0.05, "fp32")
    x, bias = torch.randn(m, 896), torch.randn(300)
    handle = BE.prepare_linear(w)
    got = {}
    for on in (True, False):
        was = _native.llm_prefill_engine_gemm(on)
        try:
            assert _native.llm_prefill_engine_gemm() is on
            got[on] = BE.linear(x, handle, bias)
        finally:
            _native.llm_prefill_engine_gemm(was)
        assert _native.llm_prefill_engine_gemm() is was
    want = _linear_ref(x, w, bias)
    mag = (x.abs().double() @ w.dequantize(torch.float64).abs().T).float() + bias.abs()
    for out in got.values():
        assert ((out - want).abs() <= 1e-5 * mag + 1e-6).all()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 70),
    blocks=st.integers(1, 12),
    group=st.sampled_from([32, 64, 128]),
    m=st.integers(1, 4),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    seed=st.integers(0, 2**16),
)
def test_int4_int8_hypothesis(n: int, blocks: int, group: int, m: int, scale: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    k = blocks * group
    w = torch.randn(n, k, generator=gen) * scale
    x = torch.randn(m, k, generator=gen)
    x[:, : k // 3] = 0.0  # whole zero blocks quantize to scale 0
    for kind in ("int8", "int4"):
        q = quantize(w, kind, group)
        _check_quant(BE.linear(x, BE.prepare_linear(q), None), _linear_ref(x, q), x, q)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 300), kx=st.integers(1, 300), m=st.integers(0, 3))
def test_linear_shape_boundary(k: int, kx: int, m: int) -> None:
    h = BE.prepare_linear(quantize(torch.randn(5, k), "int8"))
    x = torch.randn(m, kx)
    if k != kx:
        with pytest.raises(ValueError, match="features"):
            BE.linear(x, h, None)
    else:
        assert BE.linear(x, h, None).shape == (m, 5)


# -- bad input is an exception ----------------------------------------------------------------
def test_bad_inputs_raise() -> None:
    # every tensor is bound to a name: a descriptor of a freed temporary would dangle
    h = BE.prepare_linear(quantize(torch.randn(4, 64), "int8"))
    x, out = torch.randn(2, 64), torch.empty(2, 4)
    with pytest.raises(ValueError, match="dtype"):
        h.linear(_arg(x.double()), _arg(out))
    with pytest.raises(ValueError, match="contiguous"):
        xt = torch.randn(64, 2).T
        h.linear(_arg(xt), _arg(out))
    with pytest.raises(ValueError, match="differ"):
        out5 = torch.empty(2, 5)
        h.linear(_arg(x), _arg(out5))
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor, got tuple"):
        h.linear((x.data_ptr(), (2, 64), (64, 1), "torch.float32"), _arg(out))
    with pytest.raises(ValueError, match="meta"):
        h.linear(_arg(torch.empty(2, 64, device="meta")), _arg(out))
    with pytest.raises(ValueError, match="overlaps"):
        y = torch.randn(1, 64)
        h2 = BE.prepare_linear(quantize(torch.randn(64, 64), "int8"))
        h2.linear(_arg(y), _arg(y))
    with pytest.raises(ValueError, match="-128"):
        q8, s8 = torch.full((1, 4), -128, dtype=torch.int8), torch.ones(1)
        _native.llm_pack_int8(_arg(q8), _arg(s8))
    with pytest.raises(ValueError, match="group"):
        q = torch.zeros(2, 24, dtype=torch.uint8)
        s4 = torch.ones(2, 1)
        _native.llm_pack_int4(_arg(q), _arg(s4), _arg(s4), 32)
    with pytest.raises(ValueError, match="activation"):
        g = torch.randn(2, 3)
        u, o = g.clone(), torch.empty(2, 3)
        _native.llm_gated_act(_arg(g), _arg(u), _arg(o), "relu")
    with pytest.raises(ValueError, match="multiple"):
        q = torch.randn(1, 3, 1, 8)
        kv = torch.randn(1, 2, 4, 8)
        m = torch.ones(1, 1, 1, 4, dtype=torch.bool)
        v, o = kv.clone(), torch.empty(1, 3, 1, 8)
        _native.llm_attention(_arg(q), _arg(kv), _arg(v), _arg(m), _arg(o), 1.0)


# -- small kernels ---------------------------------------------------------------------------
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(1, 64), (3, 67), (1, 4, 1, 16), (2, 3, 5, 16)])
def test_rms_norm(offset: float, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape) * 3
    w = torch.randn(shape[-1])
    torch.testing.assert_close(BE.rms_norm(x, w, 1e-6, offset), reference.rms_norm(x, w, 1e-6, offset))


def test_rms_norm_of_a_transposed_view() -> None:
    x = torch.randn(1, 3, 4, 16).transpose(1, 2)
    w = torch.randn(16)
    torch.testing.assert_close(BE.rms_norm(x, w, 1e-5, 0.0), reference.rms_norm(x, w, 1e-5, 0.0))


@pytest.mark.parametrize("act", list(Activation))
@pytest.mark.parametrize("shape", [(1, 1), (1, 4864), (3, 129)])
def test_gated_act(act: Activation, shape: tuple[int, int]) -> None:
    g, u = torch.randn(shape) * 4, torch.randn(shape)
    torch.testing.assert_close(BE.gated_act(g, u, act), reference.gated_act(g, u, act))


@pytest.mark.parametrize("rot", [16, 8])
@pytest.mark.parametrize(("b", "h", "t"), [(1, 14, 1), (2, 3, 5)])
def test_rope(rot: int, b: int, h: int, t: int) -> None:
    d = 16
    x = torch.randn(b, t, h, d).transpose(1, 2)  # the model's strided view
    ang = torch.randn(b, t, rot // 2)
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    torch.testing.assert_close(BE.rope(x, cos, sin), reference.rope(x, cos, sin))


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize(
    ("b", "h", "kv", "t", "s", "d"), [(1, 14, 2, 1, 9, 64), (2, 4, 2, 3, 7, 16), (1, 4, 4, 1, 300, 32)]
)
def test_attention_over_cache_views(b: int, h: int, kv: int, t: int, s: int, d: int, softcap: float | None) -> None:
    torch.manual_seed(s)
    cap = s + 5
    kc, vc = torch.randn(b, kv, cap, d), torch.randn(b, kv, cap, d)
    k, v = kc[:, :, :s], vc[:, :, :s]  # views of the KV cache, as tb-llm passes them
    q = torch.randn(b, h, t, d)
    mask = torch.rand(b, 1, t, s) > 0.3
    mask[..., 0] = True
    got = BE.attention(q, k, v, mask, d**-0.5, softcap)
    torch.testing.assert_close(got, reference.attention(q, k, v, mask, d**-0.5, softcap), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t", [1, 8, 9, 16, 17, 100, 512])
@pytest.mark.parametrize(("past", "d", "padded"), [(0, 64, False), (7, 40, True), (3, 72, False)])
def test_prefill_attention_query_counts(t: int, past: int, d: int, padded: bool) -> None:
    """Causal prefill after `past` cached positions (from 16 queries on: Rust ``llm/attn.rs``,
    below: the per-row kernel; head dims that are not multiples of 16 pad the value panels),
    against SDPA; with ``padded`` a batch row that cannot see its first two keys, as a
    left-padded batch."""
    torch.manual_seed(t + past + d)
    b, h, kv = (2 if padded else 1), 14, 2
    s = past + t
    kc, vc = torch.randn(b, kv, s + 4, d), torch.randn(b, kv, s + 4, d)
    k, v = kc[:, :, :s], vc[:, :, :s]
    q = torch.randn(b, h, t, d) * 2
    qpos = torch.arange(past, s)
    mask = (torch.arange(s)[None, :] <= qpos[:, None]).expand(b, 1, t, s).clone()
    if padded:
        mask[1, :, :, :2] = False
    got = BE.attention(q, k, v, mask, d**-0.5, None)
    torch.testing.assert_close(got, reference.attention(q, k, v, mask, d**-0.5, None), rtol=1e-4, atol=1e-5)


# -- the fused step (compile_model) on tb-core model descriptions --------------------------------
def _spec(spec_id: str) -> ModelSpec:
    return next(s for s in MODEL_SPECS if s.id == spec_id)


def _compiled(spec_id: str) -> tuple[ModelDescription, Any]:
    model = random_model(_spec(spec_id), BE.prepare_linear)
    step = BE.compile_model(model)
    assert step is not None, "every model a description holds runs as one native step"
    return model, step


def _cache(model: ModelDescription, capacity: int) -> KVCache:
    return KVCache(
        model.num_layers, 1, model.num_kv_heads, model.head_dim, capacity, torch.float32, torch.device("cpu")
    )


def test_fused_step_declines_other_caches_untouched() -> None:
    _, step = _compiled("llama")

    class View:  # the protocol's surface, but not a KVCache (as tb-llm's server's row views)
        length = 0
        pos = torch.full((1, 4), -1)

        def begin(self, positions: torch.Tensor) -> None:
            raise AssertionError("a declined call must not touch the cache")

    assert step(torch.tensor([[1, 2]]), torch.arange(2)[None], View(), True) is NotImplemented


def test_fused_step_rebinds_when_the_cache_grows() -> None:
    """Decode one token at a time into a 2-slot cache: it grows 2 -> 4 -> 8 and the step binds
    each new set of buffers (KVCache.generation) before writing; keys and logits match the
    reference forward of the same description over the whole sequence."""
    model, step = _compiled("qwen3")
    cache = _cache(model, 2)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    first = cache.generation
    got = [step(ids[:, i : i + 1], torch.tensor([[i]]), cache, True) for i in range(8)]
    assert cache.generation > first and cache.length == 8
    want_cache = _cache(model, 8)
    want = forward(
        random_model(_spec("qwen3"), lambda w: w), ReferenceKernels(), ids, torch.arange(8)[None], want_cache, False
    )
    torch.testing.assert_close(torch.stack(got, dim=1)[0], want[0], rtol=1e-4, atol=1e-4)
    for i in range(model.num_layers):
        torch.testing.assert_close(cache.keys(i)[:, :, :8], want_cache.keys(i)[:, :, :8], rtol=1e-4, atol=1e-4)


def test_fused_step_rejects_bad_descriptors() -> None:
    model, step = _compiled("llama-int8")
    h, vocab, d = model.hidden_size, model.vocab_size, model.head_dim
    cache = _cache(model, 4)
    kv = step._kv(cache)
    x = torch.randn(1, h)
    pos = torch.zeros(1, 1, dtype=torch.long)
    cos = torch.ones(1, 1, d)
    sin = torch.zeros(1, 1, d)
    logits = torch.empty(1, vocab)
    native = step.native
    with pytest.raises(ValueError, match="do not fit"):
        native.step(_arg(x), _arg(pos), _arg(cos), _arg(sin), _arg(cache.pos), 4, kv, _arg(logits), True)
    with pytest.raises(ValueError, match="dtype"):
        native.step(_arg(x), _arg(pos.int()), _arg(cos), _arg(sin), _arg(cache.pos), 0, kv, _arg(logits), True)
    with pytest.raises(ValueError, match="overlaps"):
        alias = cache.keys(0).reshape(-1)[:h].view(1, -1)
        native.step(_arg(alias), _arg(pos), _arg(cos), _arg(sin), _arg(cache.pos), 0, kv, _arg(logits), True)
    with pytest.raises(ValueError, match="overlap"):
        _native.LLMKVCache([_arg(cache.keys(0)), _arg(cache.keys(0))], [_arg(cache.values(0)), _arg(cache.values(1))])


def test_compile_declines_a_model_with_a_weight_it_did_not_pack() -> None:
    seen = [0]

    def prepare(w: QuantWeight) -> Any:
        seen[0] += 1
        return DeclinedWeight(w) if seen[0] == 3 else BE.prepare_linear(w)

    assert BE.compile_model(random_model(_spec("llama"), prepare)) is None


def test_compile_declines_a_bf16_model() -> None:
    model = random_model(_spec("llama"), BE.prepare_linear)
    assert BE.compile_model(dataclasses.replace(model, dtype=torch.bfloat16)) is None
