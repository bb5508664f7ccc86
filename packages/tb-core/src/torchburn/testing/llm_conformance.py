"""The LLM backend conformance suite. A backend package runs it by subclassing once:

    from torchburn.testing import LLMBackendConformance

    class TestMyLLMBackend(LLMBackendConformance):
        backend_type = MyLLMBackend  # what it claims is read from the class
        engine = "my_engine"  # optional: also checks the registered descriptor

Every kernel and hook the backend defines (``torchburn.llm.protocol``) is checked against
tb-core's PyTorch reference math (``torchburn.llm.reference``), and ``compile_model`` on small
random :class:`~torchburn.llm.model.ModelDescription`\\ s against their per-kernel forward pass
over the reference. It needs only tb-core, torch and pytest (not tb-llm).

Declines: a kernel may answer any call with ``NotImplemented`` except the float32 decode-shaped
cases marked ``must_accept``; what it does answer must be right. A case whose id is in ``xfail``
is expected to fail, with the reason. The module imports without pytest (pytest is only needed
to run the suite), so ``torchburn.testing`` exports it eagerly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from torchburn.llm import reference
from torchburn.llm.activation import Activation
from torchburn.llm.descriptor import llm_backends
from torchburn.llm.kv_cache import KVCache
from torchburn.llm.model import DeclinedWeight, DecoderLayer, ModelDescription, PreparedLinear
from torchburn.llm.model_forward import forward
from torchburn.llm.protocol import HOOKS, KERNELS, PROTOCOL_VERSION, KernelBackend, declined
from torchburn.llm.quantize import quantize
from torchburn.llm.weights import QuantWeight


@dataclass(frozen=True)
class Tolerances:
    """How close a backend's numbers must be to the reference's."""

    #: elementwise kernels (norms, RoPE, gated activations, attention) in float32
    rtol: float = 1e-5
    atol: float = 1e-5
    #: linear: |error| <= linear_rtol * (|x| @ |W|.T) + 1e-6, against the float64 product
    linear_rtol: float = 3e-5
    #: int8 / int4 weights: a backend that rounds activations (to int8 per block, as llama.cpp's
    #: Q8 activations) may add ``step * rowmax(|x|) * sum_k |W[n, k]|``
    quantized_activation_step: float = 0.0
    #: bf16 / int8 / int4 weights (never fp32): a backend that rounds activations to bfloat16
    #: for its matrix units (as eager bfloat16 does; int4 weights rounded likewise) may add
    #: ``bf16_rounding * (|x| @ |W|.T)``: 2^-9 per rounded factor
    bf16_rounding: float = 0.0
    #: compile_model's logits: allclose for float32 weights; for quantized weights a cosine above
    #: ``1 - quantized_logit_cosine_gap`` and a max error below this share of the largest logit
    logits_rtol: float = 1e-4
    logits_atol: float = 1e-4
    quantized_logit_cosine_gap: float = 1e-3
    quantized_logit_max_error: float = 0.05


@dataclass(frozen=True)
class LLMCase:
    """One check: ``run(backend, tolerances)`` raises AssertionError when the backend is wrong."""

    id: str
    needs: str  # the protocol method the backend must define for the case to apply ("" = always)
    run: Callable[[Any, Tolerances], None]


def claims(backend_type: type) -> frozenset[str]:
    """The protocol methods a backend class defines."""
    return frozenset(m for m in (*KERNELS, *HOOKS) if callable(getattr(backend_type, m, None)))


# -- small helpers --------------------------------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _call_unchanged(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn`` and check it left every tensor argument as it was."""
    before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    out = fn(*args)
    for a, b in zip(args, before):
        if b is not None:
            assert torch.equal(a, b), f"{getattr(fn, '__name__', fn)} wrote into one of its inputs"
    return out


def _check_kernel_result(name: str, got: Any, want: torch.Tensor, must_accept: bool, tol: Tolerances) -> None:
    if got is NotImplemented:
        assert not must_accept, f"{name} declined a float32 case every backend that defines {name} must run"
        return
    assert isinstance(got, torch.Tensor), f"{name} returned {type(got).__name__}, not a tensor or NotImplemented"
    assert got.shape == want.shape, f"{name}: shape {list(got.shape)}, expected {list(want.shape)}"
    if want.dtype == torch.bfloat16 or got.dtype == torch.bfloat16:
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=tol.rtol, atol=tol.atol)


# -- kernel cases ---------------------------------------------------------------------------------
def _rms_norm_cases() -> Iterator[LLMCase]:
    shapes = [(1, 64), (3, 67), (1, 4, 1, 16), (2, 3, 5, 16)]
    for shape in shapes:
        for offset in (0.0, 1.0):
            for dtype in (torch.float32, torch.bfloat16):

                def run(
                    be: Any, tol: Tolerances, shape: Any = shape, offset: float = offset, dtype: Any = dtype
                ) -> None:
                    g = _gen(len(shape) * 7 + int(offset))
                    x = (torch.randn(shape, generator=g) * 3).to(dtype)
                    w = torch.randn(shape[-1], generator=g).to(torch.float32 if offset else dtype)
                    got = _call_unchanged(be.rms_norm, x, w, 1e-6, offset)
                    want = reference.rms_norm(x, w, 1e-6, offset)
                    _check_kernel_result("rms_norm", got, want, dtype == torch.float32 and len(shape) == 2, tol)

                tag = "x".join(map(str, shape))
                yield LLMCase(f"rms_norm-{tag}-off{offset:g}-{str(dtype)[6:]}", "rms_norm", run)

    def transposed(be: Any, tol: Tolerances) -> None:
        x = torch.randn(1, 3, 4, 16, generator=_gen(3)).transpose(1, 2)  # a strided view, as q / k arrive
        w = torch.randn(16, generator=_gen(4))
        _check_kernel_result("rms_norm", be.rms_norm(x, w, 1e-5, 0.0), reference.rms_norm(x, w, 1e-5, 0.0), True, tol)

    yield LLMCase("rms_norm-strided-view", "rms_norm", transposed)


def _rope_cases() -> Iterator[LLMCase]:
    for b, h, t in ((1, 14, 1), (2, 3, 5)):
        for rot in (16, 8):  # 8 of 16: partial rotary, the rest passes through

            def run(be: Any, tol: Tolerances, b: int = b, h: int = h, t: int = t, rot: int = rot) -> None:
                d = 16
                g = _gen(b * 100 + h + t + rot)
                x = torch.randn(b, t, h, d, generator=g).transpose(1, 2)  # the model's strided view
                ang = torch.randn(b, t, rot // 2, generator=g)
                emb = torch.cat((ang, ang), dim=-1)
                cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
                got = _call_unchanged(be.rope, x, cos, sin)
                _check_kernel_result("rope", got, reference.rope(x, cos, sin), True, tol)

            yield LLMCase(f"rope-b{b}-h{h}-t{t}-rot{rot}of16", "rope", run)


def _attention_cases() -> Iterator[LLMCase]:
    shapes = [  # (b, h, kv, t, s, d): decode with GQA, a few queries, MHA over a long cache, a prompt
        (1, 14, 2, 1, 9, 64),
        (2, 4, 2, 3, 7, 16),
        (1, 4, 4, 1, 300, 32),
        (1, 8, 2, 20, 20, 16),
    ]
    for b, h, kv, t, s, d in shapes:
        for softcap in (None, 5.0):
            for causal in (False, True):

                def run(
                    be: Any,
                    tol: Tolerances,
                    b: int = b,
                    h: int = h,
                    kv: int = kv,
                    t: int = t,
                    s: int = s,
                    d: int = d,
                    softcap: float | None = softcap,
                    causal: bool = causal,
                ) -> None:
                    g = _gen(s * 31 + t + h)
                    cap = s + 5
                    kc, vc = torch.randn(b, kv, cap, d, generator=g), torch.randn(b, kv, cap, d, generator=g)
                    k, v = kc[:, :, :s], vc[:, :, :s]  # views of a KV cache buffer, as a model passes them
                    q = torch.randn(b, h, t, d, generator=g) * 2
                    if causal:
                        qpos = torch.arange(s - t, s)
                        mask = (torch.arange(s)[None, :] <= qpos[:, None]).expand(b, 1, t, s).clone()
                        mask[-1, :, :, :2] = False  # the last row as a left-padded one
                    else:
                        mask = torch.rand(b, 1, t, s, generator=g) > 0.3
                    mask[..., -1] = True  # every query sees at least one key
                    got = _call_unchanged(be.attention, q, k, v, mask, d**-0.5, softcap)
                    want = reference.attention(q.double(), k.double(), v.double(), mask, d**-0.5, softcap).float()
                    _check_kernel_result("attention", got, want, t == 1 and softcap is None, tol)

                cap_tag = "none" if softcap is None else f"{softcap:g}"
                yield LLMCase(
                    f"attention-b{b}-h{h}-kv{kv}-t{t}-s{s}-d{d}-softcap{cap_tag}-{'causal' if causal else 'random'}",
                    "attention",
                    run,
                )


def _gated_act_cases() -> Iterator[LLMCase]:
    for act in Activation:
        for shape in ((1, 1), (1, 1000), (3, 129)):
            for dtype in (torch.float32, torch.bfloat16):

                def run(
                    be: Any, tol: Tolerances, act: Activation = act, shape: Any = shape, dtype: Any = dtype
                ) -> None:
                    g = _gen(shape[1] + len(act.value))
                    gate = (torch.randn(shape, generator=g) * 4).to(dtype)
                    up = torch.randn(shape, generator=g).to(dtype)
                    got = _call_unchanged(be.gated_act, gate, up, act)
                    want = reference.gated_act(gate, up, act)
                    _check_kernel_result("gated_act", got, want, dtype == torch.float32, tol)

                yield LLMCase(f"gated_act-{act.value}-{shape[0]}x{shape[1]}-{str(dtype)[6:]}", "gated_act", run)


def _embedding_cases() -> Iterator[LLMCase]:
    for kind in ("fp32", "bf16", "int8", "int4"):

        def run(be: Any, tol: Tolerances, kind: str = kind) -> None:
            table = quantize(torch.randn(50, 256, generator=_gen(1)), kind, 64)
            ids = torch.tensor([[3, 0, 49], [7, 7, 1]])
            got = be.embedding(ids, table)
            if got is NotImplemented:
                return
            want = table.rows(ids, got.dtype)
            assert got.shape == (2, 3, 256)
            torch.testing.assert_close(got, want, rtol=0, atol=0)

        yield LLMCase(f"embedding-{kind}", "embedding", run)


# -- weights --------------------------------------------------------------------------------------
def _linear_bound(x: torch.Tensor, w: QuantWeight, tol: Tolerances) -> torch.Tensor:
    wabs = w.dequantize(torch.float64).abs()
    rtol = tol.linear_rtol + (tol.bf16_rounding if w.kind != "fp32" else 0.0)
    bound = rtol * (x.abs().double() @ wabs.T) + 1e-6
    if w.kind in ("int8", "int4") and tol.quantized_activation_step:
        rowmax = x.abs().double().amax(dim=1, keepdim=True)
        bound = bound + tol.quantized_activation_step * rowmax * wabs.sum(dim=1)[None, :]
    return bound.float()


def check_linear(be: Any, w: QuantWeight, x: torch.Tensor, bias: torch.Tensor | None, tol: Tolerances) -> None:
    """``be.linear`` over ``be.prepare_linear(w)`` against the float64 product (the weight must
    not be declined: callers pass the layouts the backend claims)."""
    handle = be.prepare_linear(w)
    assert handle is not NotImplemented, f"prepare_linear declined a {w.kind} weight {list(w.shape)}"
    got = _call_unchanged(be.linear, x, handle, bias)
    want = reference.linear(x.double(), w, bias).float()
    assert isinstance(got, torch.Tensor) and got.shape == want.shape, f"linear gave {got!r}"
    err = (got.float() - want).abs()
    bound = _linear_bound(x, w, tol) + (0 if bias is None else 1e-6 * bias.abs().float())
    worst = float((err - bound).max())
    assert worst <= 0, f"{w.kind} linear {list(w.shape)} x {list(x.shape)}: error exceeds its bound by {worst:.3g}"


def _linear_cases(kinds: tuple[str, ...]) -> Iterator[LLMCase]:
    shapes = [(1, 32), (37, 128), (70, 256), (5, 67)]
    for kind in kinds:
        for n, k in shapes:
            for m in (1, 3, 17):

                def run(be: Any, tol: Tolerances, kind: str = kind, n: int = n, k: int = k, m: int = m) -> None:
                    g = _gen(n * k + m)
                    w = quantize(torch.randn(n, k, generator=g), kind, 32)
                    x = torch.randn(m, k, generator=g)
                    check_linear(be, w, x, torch.randn(n, generator=g) if m == 3 else None, tol)

                yield LLMCase(f"linear-{kind}-m{m}-n{n}-k{k}", "prepare_linear", run)
    if "int4" in kinds:
        for group in (32, 64, 128):

            def run_group(be: Any, tol: Tolerances, group: int = group) -> None:
                g = _gen(group)
                w = quantize(torch.randn(24, 384, generator=g) * 3, "int4", group)
                assert w.kind == "int4" and w.group_size == group
                check_linear(be, w, torch.randn(2, 384, generator=g), torch.randn(24, generator=g), tol)

            yield LLMCase(f"linear-int4-group{group}", "prepare_linear", run_group)

    def wrong_features(be: Any, tol: Tolerances) -> None:
        import pytest

        handle = be.prepare_linear(quantize(torch.randn(5, 64), kinds[0] if kinds else "fp32", 32))
        with pytest.raises((ValueError, RuntimeError)):
            be.linear(torch.randn(2, 48), handle, None)

    yield LLMCase("linear-wrong-in-features-raises", "prepare_linear", wrong_features)


def _quantize_linear_cases() -> Iterator[LLMCase]:
    for quant in ("int8", "int4"):
        for dtype in (torch.float32, torch.bfloat16):

            def run(be: Any, tol: Tolerances, quant: str = quant, dtype: Any = dtype) -> None:
                w = (torch.randn(40, 256, generator=_gen(7)) * 0.05).to(dtype)
                fast = be.quantize_linear(w, quant, 32)
                if declined(fast):
                    return
                slow = be.prepare_linear(quantize(w, quant, 32))
                x = torch.randn(3, 256, generator=_gen(8))
                assert torch.equal(be.linear(x, fast, None), be.linear(x, slow, None)), (
                    f"quantize_linear({quant}) does not give prepare_linear(quantize(...))'s weight"
                )

            yield LLMCase(f"quantize_linear-{quant}-{str(dtype)[6:]}", "quantize_linear", run)


def _embedding_table_cases(kinds: tuple[str, ...]) -> Iterator[LLMCase]:
    for kind in kinds:

        def run(be: Any, tol: Tolerances, kind: str = kind) -> None:
            qw = quantize(torch.randn(50, 256, generator=_gen(2)), kind, 64)
            table = be.embedding_table(be.prepare_linear(qw))
            if declined(table):
                return
            ids = torch.tensor([[3, 0, 49], [7, 7, 1]])
            assert table.kind == kind
            assert torch.equal(table.rows(ids, torch.float32), qw.rows(ids, torch.float32))
            assert torch.equal(table.rows(None, torch.float32), qw.dequantize(torch.float32))

        yield LLMCase(f"embedding_table-{kind}", "embedding_table", run)


# -- whole models ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """A tiny random model: which features of a description it exercises."""

    id: str
    quant: str = "fp32"
    fused_qkv: bool = False
    fused_gate_up: bool = False
    bias: bool = False
    qk_norm: bool = False
    sandwich: bool = False
    norm_offset: float = 0.0
    embed_scale: bool = False
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int | None = None
    rotary_dim: int = 16
    activation: Activation = Activation.SILU


MODEL_SPECS = [
    ModelSpec("llama"),
    ModelSpec("llama-int8", quant="int8"),
    ModelSpec("llama-int4", quant="int4"),
    ModelSpec("llama-bf16", quant="bf16"),
    ModelSpec("qwen3", bias=True, qk_norm=True),
    ModelSpec("phi3", fused_qkv=True, fused_gate_up=True, rotary_dim=8),
    ModelSpec(
        "gemma2",
        sandwich=True,
        norm_offset=1.0,
        embed_scale=True,
        attn_softcap=20.0,
        final_softcap=10.0,
        sliding_window=4,
        activation=Activation.GELU_TANH,
    ),
    ModelSpec(
        "gemma2-int4", quant="int4", sandwich=True, norm_offset=1.0, sliding_window=4, activation=Activation.GELU
    ),
]


def random_model(spec: ModelSpec, prepare: Callable[[QuantWeight], Any], seed: int = 0) -> ModelDescription:
    """A 2-layer model (hidden 64, 4 query / 2 KV heads of 16, vocab 96) with ``spec``'s
    features; every linear weight goes through ``prepare`` (same weights for the same seed)."""
    g = _gen(seed)
    h, nh, kv, d, inter, vocab = 64, 4, 2, 16, 128, 96

    def lin(n: int, k: int, bias: bool = False) -> PreparedLinear:
        w = quantize(torch.randn(n, k, generator=g) * 0.1, spec.quant, 32)
        return PreparedLinear(prepare(w), torch.randn(n, generator=g) * 0.1 if bias else None, n)

    def norm(n: int) -> torch.Tensor:
        return torch.randn(n, generator=g) * 0.1 + (0.0 if spec.norm_offset else 1.0)

    layers = []
    for i in range(2):
        qkv = (
            [lin((nh + 2 * kv) * d, h, spec.bias)]
            if spec.fused_qkv
            else [lin(nh * d, h, spec.bias), lin(kv * d, h, spec.bias), lin(kv * d, h, spec.bias)]
        )
        gate_up = [lin(2 * inter, h)] if spec.fused_gate_up else [lin(inter, h), lin(inter, h)]
        layers.append(
            DecoderLayer(
                input_norm=norm(h),
                post_attn_norm=norm(h),
                pre_ff_norm=norm(h) if spec.sandwich else None,
                post_ff_norm=norm(h) if spec.sandwich else None,
                qkv=qkv,
                o=lin(h, nh * d),
                q_norm=norm(d) if spec.qk_norm else None,
                k_norm=norm(d) if spec.qk_norm else None,
                gate_up=gate_up,
                down=lin(h, inter),
                sliding=spec.sliding_window is not None and i == 0,
            )
        )
    embed = quantize(torch.randn(vocab, h, generator=g), "fp32")
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, spec.rotary_dim, 2, dtype=torch.float32) / spec.rotary_dim))

    def rope(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.clamp(min=0)[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    return ModelDescription(
        hidden_size=h,
        num_heads=nh,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=inter,
        vocab_size=vocab,
        rms_norm_eps=1e-6,
        norm_offset=spec.norm_offset,
        attn_scale=d**-0.5,
        attn_softcap=spec.attn_softcap,
        final_softcap=spec.final_softcap,
        sliding_window=spec.sliding_window,
        activation=spec.activation,
        embed_scale=math.sqrt(h) if spec.embed_scale else None,
        rotary_dim=spec.rotary_dim,
        rope=rope,
        embed=embed,
        layers=tuple(layers),
        norm=norm(h),
        lm_head=lin(vocab, h),
    )


class _RowView:
    """A cache that is not a KVCache (as tb-llm's server's per-row views): a step may decline it."""

    def __init__(self, cache: KVCache) -> None:
        self._cache = cache

    @property
    def length(self) -> int:
        return self._cache.length

    @property
    def pos(self) -> torch.Tensor:
        return self._cache.pos

    def begin(self, positions: torch.Tensor) -> None:
        self._cache.begin(positions)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._cache.write(layer, k, v)

    def commit(self, t: int) -> None:
        self._cache.commit(t)


def _steps(step: Callable[..., Any], model: ModelDescription, prompts: list[list[int]], decode: int) -> Any:
    """Prefill left-padded ``prompts`` (every position's logits), then ``decode`` greedy steps of
    the reference's choosing; returns (logits per step, cache). The cache starts small so it grows."""
    b, n = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(b, n, dtype=torch.long)
    pos = torch.full((b, n), -1, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, n - len(p) :] = torch.tensor(p)
        pos[i, n - len(p) :] = torch.arange(len(p))
    cache = KVCache(model.num_layers, b, model.num_kv_heads, model.head_dim, 2, model.dtype, torch.device("cpu"))
    out = [step(ids, pos, cache, False)]
    last = pos[:, -1]
    for i in range(decode):
        last = last + 1
        nxt = torch.tensor([[(7 * i + 3 * r + 5) % model.vocab_size] for r in range(b)])
        out.append(step(nxt, last[:, None], cache, True))
    return out, cache


def _compare_logits(got: torch.Tensor, want: torch.Tensor, quantized: bool, tol: Tolerances) -> None:
    assert got.shape == want.shape and got.dtype == torch.float32, f"logits {got.shape} {got.dtype}"
    if not quantized:
        torch.testing.assert_close(got, want, rtol=tol.logits_rtol, atol=tol.logits_atol)
        return
    g, w = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
    cos = torch.nn.functional.cosine_similarity(g, w, dim=-1)
    assert float(cos.min()) > 1 - tol.quantized_logit_cosine_gap, f"logit cosine {float(cos.min()):.5f}"
    assert float((g - w).abs().max()) < tol.quantized_logit_max_error * float(w.abs().max())


def _compile_cases(must_compile: bool) -> Iterator[LLMCase]:
    for spec in MODEL_SPECS:

        def run(be: Any, tol: Tolerances, spec: ModelSpec = spec) -> None:
            def prepare(w: QuantWeight) -> Any:
                handle = be.prepare_linear(w) if callable(getattr(be, "prepare_linear", None)) else NotImplemented
                return DeclinedWeight(w) if handle is NotImplemented else handle

            model = random_model(spec, prepare)
            want_model = random_model(spec, lambda w: w)  # the same weights, the reference's handles
            step = be.compile_model(model)
            if declined(step):
                assert not (must_compile and spec.quant == "fp32"), "compile_model declined a float32 model"
                return
            ref = reference.ReferenceKernels()

            def want_step(*args: Any) -> Any:
                return forward(want_model, ref, *args)

            prompts = [[5, 9, 11, 3, 7], [12, 4, 1]]
            if spec.id == "llama":  # a prompt long enough for prefill-sized kernels
                prompts = [[(i * 37 + 11) % 96 for i in range(24)], [(i * 53 + 5) % 96 for i in range(13)]]
            got, c1 = _steps(step, model, prompts, 4)
            want, c2 = _steps(want_step, want_model, prompts, 4)
            quantized = spec.quant != "fp32"
            assert got[0].shape == (2, len(prompts[0]), model.vocab_size), "last_only=False gives [B, T, V]"
            real = c2.pos[:, : got[0].shape[1]] >= 0  # a padding position's logits are not specified
            got[0], want[0] = got[0][real], want[0][real]
            for a, b in zip(got, want):
                _compare_logits(a, b, quantized, tol)
            assert c1.length == c2.length and torch.equal(c1.pos, c2.pos), "the step's cache slots differ"
            for i in range(model.num_layers):
                for mine, theirs in ((c1.keys(i), c2.keys(i)), (c1.values(i), c2.values(i))):
                    real_slots = (c2.pos[:, : c2.length] >= 0)[:, None, :, None]  # padding slots: unspecified
                    a, w = mine[:, :, : c1.length] * real_slots, theirs[:, :, : c2.length] * real_slots
                    if quantized:  # rounded activations move a few values by a few hundredths
                        assert float((a - w).abs().max()) < tol.quantized_logit_max_error * float(w.abs().max())
                    else:
                        torch.testing.assert_close(a, w, rtol=tol.logits_rtol, atol=tol.logits_atol)
            # a cache that is not a KVCache: declined untouched, or run right
            view_cache = KVCache(model.num_layers, 1, model.num_kv_heads, model.head_dim, 8, model.dtype, c1.device)
            ids, pos = torch.tensor([[1, 2, 3]]), torch.arange(3)[None]
            out = step(ids, pos, _RowView(view_cache), True)
            if out is NotImplemented:
                untouched = view_cache.length == 0 and bool((view_cache.pos == -1).all())
                assert untouched, "a step that declines a call must not touch the cache"
            else:
                ref_cache = KVCache(model.num_layers, 1, model.num_kv_heads, model.head_dim, 8, model.dtype, c1.device)
                _compare_logits(out, want_step(ids, pos, ref_cache, True), quantized, tol)

        yield LLMCase(f"compile_model-{spec.id}", "compile_model", run)


def llm_cases(weight_kinds: tuple[str, ...], must_compile: bool) -> list[LLMCase]:
    """Every case of the suite, for a backend that prepares ``weight_kinds``."""
    return [
        *_rms_norm_cases(),
        *_rope_cases(),
        *_attention_cases(),
        *_gated_act_cases(),
        *_embedding_cases(),
        *_linear_cases(weight_kinds),
        *_quantize_linear_cases(),
        *_embedding_table_cases(weight_kinds),
        *_compile_cases(must_compile),
    ]


class LLMBackendConformance:
    #: the backend's class: what it claims (the protocol methods it defines) is read from it
    backend_type: ClassVar[type] = object
    #: the engine whose registered descriptor (``tb_register_llm_backends``) is checked too
    engine: ClassVar[str] = ""
    #: the weight layouts its ``prepare_linear`` must take
    weight_kinds: ClassVar[tuple[str, ...]] = ("fp32", "bf16", "int8", "int4")
    #: whether ``compile_model`` must compile the float32 models (quantized ones it may decline)
    must_compile: ClassVar[bool] = True
    tolerances: ClassVar[Tolerances] = Tolerances()
    xfail: ClassVar[dict[str, str]] = {}

    def make_backend(self) -> Any:
        """The backend under test; override when its constructor takes arguments."""
        return self.backend_type()

    def backend(self) -> Any:
        """``make_backend()``, made once per test class (loading a backend may be slow)."""
        cls = type(self)
        if "_made_backend" not in cls.__dict__:
            cls._made_backend = self.make_backend()  # type: ignore[attr-defined]
        return cls.__dict__["_made_backend"]

    def pytest_generate_tests(self, metafunc: Any) -> None:
        if "llm_case" not in metafunc.fixturenames:
            return
        have = claims(self.backend_type)
        cases = [c for c in llm_cases(self.weight_kinds, self.must_compile) if c.needs in have]
        metafunc.parametrize("llm_case", cases, ids=[c.id for c in cases])

    def test_claims_something(self) -> None:
        have = claims(self.backend_type)
        assert have, f"{self.backend_type.__name__} defines none of {', '.join((*KERNELS, *HOOKS))}"
        if "prepare_linear" in have or "linear" in have:
            assert {"prepare_linear", "linear"} <= have, "prepare_linear and linear come together"

    def test_protocol_version(self) -> None:
        llm_backend = self.backend()
        assert isinstance(llm_backend, KernelBackend), "a backend has a name and a protocol_version"
        assert isinstance(llm_backend.name, str) and llm_backend.name
        assert llm_backend.protocol_version == PROTOCOL_VERSION, (
            f"{llm_backend.name} implements protocol {llm_backend.protocol_version}, tb-core's is {PROTOCOL_VERSION}"
        )

    def test_registered_descriptor(self) -> None:
        assert self.engine, "set engine to the engine whose tb_register_llm_backends offers this backend"
        found = [d for d in llm_backends() if d.engine == self.engine]
        assert found, f"engine {self.engine!r} registers no LLM backend (tb_register_llm_backends)"
        for desc in found:
            assert desc.protocol_version == PROTOCOL_VERSION, (
                f"{desc.name}'s descriptor says protocol {desc.protocol_version}, tb-core's is {PROTOCOL_VERSION}"
            )
            assert desc.device in ("cpu", "gpu")
        loaded: Any = found[0].load()
        assert isinstance(loaded, self.backend_type), f"{found[0].name} loads a {type(loaded).__name__}"
        assert getattr(loaded, "protocol_version", None) == PROTOCOL_VERSION

    def test_case(self, llm_case: LLMCase) -> None:
        if llm_case.id in self.xfail:
            import pytest

            pytest.xfail(self.xfail[llm_case.id])
        llm_case.run(self.backend(), self.tolerances)
