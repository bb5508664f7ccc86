"""tb-llm's native_cpu backend: every kernel against PyTorch, and whole models against the
reference backend (same greedy tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

tb_llm = pytest.importorskip("tb_llm", reason="the LLM backend is tested where tb-llm is installed (nox -s integration)")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tb_cpu_rust import _native  # noqa: E402
from tb_cpu_rust.llm import NativeLLMBackend, _arg  # noqa: E402
from tb_llm.backends import ReferenceBackend  # noqa: E402
from tb_llm.quant import quantize  # noqa: E402

BE = NativeLLMBackend()
REF = ReferenceBackend("cpu")


def _linear_ref(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    # float64 on the exactly dequantized weight: what every layout promises
    y = x.double() @ w.dequantize(torch.float64).T
    return (y if bias is None else y + bias.double()).float()


def _check_quant(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w) -> None:
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
    ~sqrt(K) * 2^-24 typical (the 1e-5 relative bound covers K = 4864 with margin). int4 at any
    row count, and int8 below 16 rows, meet int8 activations (as llama.cpp's Q4_0 x Q8_0):
    the bound of `_check_quant`. Exact agreement of the batched int4 / int8 loops with the
    per-row GEMV is checked bit for bit in Rust (`qgemm::tests`)."""
    torch.manual_seed(m * 7 + n + k)
    w = quantize(torch.randn(n, k) * 0.05, kind, 32)
    x, bias = torch.randn(m, k), torch.randn(n)
    got = BE.linear(x, BE.prepare_linear(w), bias)
    want = _linear_ref(x, w, bias)
    if (m >= 16 and kind != "int4") or kind in ("bf16", "fp32"):
        mag = (x.abs().double() @ w.dequantize(torch.float64).abs().T).float() + bias.abs()
        assert ((got - want).abs() <= 1e-5 * mag + 1e-6).all(), float(((got - want).abs() / mag).max())
    else:
        _check_quant(got, want, x, w)


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
    with pytest.raises(ValueError, match="negative"):
        h.linear((x.data_ptr(), (2, -64), (64, 1), "torch.float32"), _arg(out))
    with pytest.raises(ValueError, match="null"):
        h.linear((0, (2, 64), (64, 1), "torch.float32"), _arg(out))
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
    torch.testing.assert_close(BE.rms_norm(x, w, 1e-6, offset), REF.rms_norm(x, w, 1e-6, offset))


def test_rms_norm_of_a_transposed_view() -> None:
    x = torch.randn(1, 3, 4, 16).transpose(1, 2)
    w = torch.randn(16)
    torch.testing.assert_close(BE.rms_norm(x, w, 1e-5, 0.0), REF.rms_norm(x, w, 1e-5, 0.0))


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 4864), (3, 129)])
def test_gated_act(act: str, shape: tuple[int, int]) -> None:
    g, u = torch.randn(shape) * 4, torch.randn(shape)
    torch.testing.assert_close(BE.gated_act(g, u, act), REF.gated_act(g, u, act))


@pytest.mark.parametrize("rot", [16, 8])
@pytest.mark.parametrize(("b", "h", "t"), [(1, 14, 1), (2, 3, 5)])
def test_rope(rot: int, b: int, h: int, t: int) -> None:
    d = 16
    x = torch.randn(b, t, h, d).transpose(1, 2)  # the model's strided view
    ang = torch.randn(b, t, rot // 2)
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    torch.testing.assert_close(BE.rope(x, cos, sin), REF.rope(x, cos, sin))


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
    torch.testing.assert_close(got, REF.attention(q, k, v, mask, d**-0.5, softcap), rtol=1e-4, atol=1e-5)


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
    torch.testing.assert_close(got, REF.attention(q, k, v, mask, d**-0.5, None), rtol=1e-4, atol=1e-5)


# -- whole models ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    from tb_llm.testing import make_checkpoint

    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = make_checkpoint(arch, tmp_path_factory.mktemp(arch) / "model")
        return made[arch]

    return get


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("quant", ["fp32", "bf16", "int8", "int4"])
def test_greedy_tokens_match_reference(ckpt, arch: str, quant: str) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    folder = ckpt(arch)
    native = LLM.from_pretrained(folder, quant=quant, device="cpu", engine="native_cpu")
    assert native.backend.name == "native_cpu"
    ref = LLM.from_pretrained(folder, quant=quant, device="cpu", engine="reference")
    prompt = native.encode("Hello world! How are you")
    a = native.generate(prompt, max_new_tokens=24, ignore_eos=True).token_ids
    b = ref.generate(prompt, max_new_tokens=24, ignore_eos=True).token_ids
    if quant in ("bf16", "int8", "int4"):
        # the reference runs these in bf16 activations, we in f32 / int8 blocks: allow the
        # tail to drift once the two disagree on a near-tie, but the start must agree
        assert a[:12] == b[:12]
    else:
        assert a == b


def test_native_is_default_backend(ckpt) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    assert LLM.from_pretrained(ckpt("llama"), device="cpu").backend.name == "native_cpu"


# -- the fused step (compile_model): every layer in one native call ---------------------------
ALL_ARCHS = list(__import__("tb_llm.testing", fromlist=["ARCHS"]).ARCHS)


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_fused_greedy_matches_transformers(ckpt, arch: str) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM
    from tb_llm.testing import reference_greedy

    folder = ckpt(arch)
    llm = LLM.from_pretrained(folder, quant="fp32", device="cpu", engine="native_cpu")
    assert llm.model._fused is not None, "every tb-llm architecture runs as one native step"
    prompt = llm.encode("Hello world! How are you")
    assert llm.generate(prompt, max_new_tokens=32, ignore_eos=True).token_ids == reference_greedy(folder, prompt, 32)


def _run_steps(model, forward, prompt: list[list[int]], steps: int, last_only: bool = True):  # type: ignore[no-untyped-def]
    """Prefill ``prompt`` (left-padded rows), then ``steps`` greedy decode steps through ``forward``;
    returns every step's logits."""
    b, n = len(prompt), max(len(r) for r in prompt)
    ids = torch.zeros(b, n, dtype=torch.long)
    pos = torch.full((b, n), -1, dtype=torch.long)
    for i, r in enumerate(prompt):
        ids[i, n - len(r) :] = torch.tensor(r)
        pos[i, n - len(r) :] = torch.arange(len(r))
    cache = model.new_cache(b, 4)  # small: the steps grow it (rebinding the native cache)
    out = [forward(ids, pos, cache, last_only)]
    last = pos[:, -1]
    for _ in range(steps):
        nxt = out[-1].reshape(b, -1, out[-1].shape[-1])[:, -1].argmax(-1)
        last = last + 1
        out.append(forward(nxt[:, None], last[:, None], cache, True))
    return out, cache


@pytest.mark.parametrize("arch", ALL_ARCHS)
@pytest.mark.parametrize("quant", ["fp32", "bf16", "int8", "int4"])
def test_fused_step_logits_match_reference_forward(ckpt, arch: str, quant: str) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    model = LLM.from_pretrained(ckpt(arch), quant=quant, device="cpu", engine="native_cpu").model
    assert model._fused is not None
    prompt = [[5, 9, 11, 3, 7], [12, 4]]  # a left-padded batch of two, 5-row prompt: fused too
    got, c1 = _run_steps(model, model._fused, prompt, 12)
    want, c2 = _run_steps(model, model.reference_forward, prompt, 12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(c1.pos, c2.pos)
    for i in range(model.cfg.num_layers):  # the cache holds the same keys and values
        torch.testing.assert_close(c1.k[i][:, :, : c1.length], c2.k[i][:, :, : c2.length], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(c1.v[i][:, :, : c1.length], c2.v[i][:, :, : c2.length], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ALL_ARCHS)
@pytest.mark.parametrize("quant", ["fp32", "int4"])
def test_fused_prefill_of_long_prompts_matches_reference_forward(ckpt, arch: str, quant: str) -> None:  # type: ignore[no-untyped-def]
    """Prompts of 16+ positions in the fused step: the prefill attention kernel (the decode one
    under a softcap), parallel row work, sliding windows (8 here) far exceeded, a left-padded
    row; then decode steps over that cache. Same logits and cache as the per-kernel path."""
    from tb_llm import LLM

    model = LLM.from_pretrained(ckpt(arch), quant=quant, device="cpu", engine="native_cpu").model
    assert model._fused is not None
    prompt = [[(i * 37 + 11) % 300 + 3 for i in range(70)], [(i * 53 + 5) % 300 + 3 for i in range(41)]]
    def check(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
        for g, w in zip(got, want):
            if quant == "fp32":
                torch.testing.assert_close(g, w, rtol=2e-4, atol=2e-4)
            else:
                # int8 activations: where the two paths' attention differs in the last bits
                # (a softcap: SDPA in the per-kernel path), an activation can round to the other
                # int8 step; the logits then differ by a few hundredths, not more
                cos = torch.nn.functional.cosine_similarity(g.reshape(-1, g.shape[-1]), w.reshape(-1, w.shape[-1]), dim=-1)
                assert float(cos.min()) > 0.999 and float((g - w).abs().max()) < 0.05 * float(w.abs().max())

    got, c1 = _run_steps(model, model._fused, prompt, 4)
    want, c2 = _run_steps(model, model.reference_forward, prompt, 4)
    check(got, want)
    tol = 1e-4 if quant == "fp32" else 2e-2
    for i in range(model.cfg.num_layers):
        torch.testing.assert_close(c1.k[i][:, :, : c1.length], c2.k[i][:, :, : c2.length], rtol=tol, atol=tol)
        torch.testing.assert_close(c1.v[i][:, :, : c1.length], c2.v[i][:, :, : c2.length], rtol=tol, atol=tol)
    # every position's logits of a 40-token prompt (last_only=False)
    got, _ = _run_steps(model, model._fused, [prompt[1][:40]], 1, last_only=False)
    want, _ = _run_steps(model, model.reference_forward, [prompt[1][:40]], 1, last_only=False)
    assert got[0].shape == (1, 40, model.cfg.vocab_size)
    check(got, want)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_fused_step_all_logits_of_a_short_prompt(ckpt, arch: str) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    model = LLM.from_pretrained(ckpt(arch), quant="fp32", device="cpu", engine="native_cpu").model
    got, _ = _run_steps(model, model._fused, [[1, 2, 3, 4, 5, 6]], 2, last_only=False)
    want, _ = _run_steps(model, model.reference_forward, [[1, 2, 3, 4, 5, 6]], 2, last_only=False)
    assert got[0].shape == (1, 6, model.cfg.vocab_size)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2"])
def test_fused_quantized_top1_agrees_with_reference(ckpt, arch: str, quant: str) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    folder = ckpt(arch)
    q = LLM.from_pretrained(folder, quant=quant, device="cpu", engine="native_cpu").model
    # the same quantized weights, dequantized to bf16 GEMMs in PyTorch (int8 activations here)
    f = LLM.from_pretrained(folder, quant=quant, device="cpu", engine="reference").model
    # teacher-forced: both see the same tokens, so one near-tie cannot derail the rest
    ids = torch.tensor([[1, 17, 42, 99, 7, 23, 64, 5, 31, 77, 12, 90, 3, 55, 28, 61]])
    agree = 0
    cq, cf = q.new_cache(1, 32), f.new_cache(1, 32)
    for i in range(ids.shape[1]):
        p = torch.tensor([[i]])
        a = q.forward(ids[:, i : i + 1], p, cq)
        b = f.forward(ids[:, i : i + 1], p, cf)
        agree += int(a.argmax() == b.argmax())
    assert agree >= 14, f"{agree}/16 top-1 agree"


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
def test_fused_batch_with_left_padding_matches_single(ckpt, arch: str) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    llm = LLM.from_pretrained(ckpt(arch), quant="fp32", device="cpu", engine="native_cpu")
    prompts = ["Hi", "The quick brown fox jumps over the lazy dog.", "Hello"]
    batch = llm.generate(prompts, max_new_tokens=14, ignore_eos=True)
    for p, g in zip(prompts, batch):
        assert g.token_ids == llm.generate(p, max_new_tokens=14, ignore_eos=True).token_ids


def test_fused_chat_rewinds_the_cache(ckpt) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    llm = LLM.from_pretrained(ckpt("qwen2"), quant="fp32", device="cpu", engine="native_cpu")
    session = llm.chat_session(system_prompt="terse")
    session.send("Hello there", max_new_tokens=6)
    session.send("Again", max_new_tokens=6)  # a short new turn: the fused step prefills it
    second = session.last
    assert second is not None
    fresh = llm.generate(session.messages[:-1], max_new_tokens=6)
    assert fresh.token_ids == second.token_ids
    # rewind to a shared prefix shorter than the cache and diverge from there
    session.messages = session.messages[:1]
    session.send("Bye", max_new_tokens=6)
    third = session.last
    assert third is not None
    assert llm.generate(session.messages[:-1], max_new_tokens=6).token_ids == third.token_ids


def test_fused_step_rejects_bad_descriptors(ckpt) -> None:  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    model = LLM.from_pretrained(ckpt("llama"), quant="int8", device="cpu", engine="native_cpu").model
    step = model._fused
    cache = model.new_cache(1, 4)
    kv = step._kv(cache)
    x = torch.randn(1, model.cfg.hidden_size)
    pos = torch.zeros(1, 1, dtype=torch.long)
    cos = torch.ones(1, 1, model.cfg.head_dim)
    sin = torch.zeros(1, 1, model.cfg.head_dim)
    logits = torch.empty(1, model.cfg.vocab_size)
    with pytest.raises(ValueError, match="do not fit"):
        step.native.step(_arg(x), _arg(pos), _arg(cos), _arg(sin), _arg(cache.pos), 4, kv, _arg(logits), True)
    with pytest.raises(ValueError, match="dtype"):
        step.native.step(_arg(x), _arg(pos.int()), _arg(cos), _arg(sin), _arg(cache.pos), 0, kv, _arg(logits), True)
    with pytest.raises(ValueError, match="overlaps"):
        alias = cache.k[0].reshape(-1)[: model.cfg.hidden_size].view(1, -1)
        step.native.step(_arg(alias), _arg(pos), _arg(cos), _arg(sin), _arg(cache.pos), 0, kv, _arg(logits), True)
    with pytest.raises(ValueError, match="overlap"):
        _native.LLMKVCache([_arg(cache.k[0]), _arg(cache.k[0])], [_arg(cache.v[0]), _arg(cache.v[1])])


def test_server_slot_caches_take_the_per_kernel_path(ckpt) -> None:  # type: ignore[no-untyped-def]
    """tb-llm's server keeps one cache row per request, each at its own length (SlotCache views):
    the fused step hands those to the per-kernel path, with the same logits as a plain cache."""
    from tb_llm import LLM
    from tb_llm.serve.slot_cache import SlotCache

    model = LLM.from_pretrained(ckpt("llama"), quant="fp32", device="cpu", engine="native_cpu").model
    assert model._fused is not None
    cfg = model.cfg
    slots = SlotCache(cfg.num_layers, 2, cfg.num_kv_heads, cfg.head_dim, 8, torch.float32, torch.device("cpu"))
    prompts, nxt = [[5, 9, 11], [12, 4, 7, 8]], [3, 6]
    want = []
    for row, p in enumerate(prompts):
        ids, pos = torch.tensor([p]), torch.arange(len(p))[None]
        plain = model.new_cache(1, 8)
        first = model.reference_forward(ids, pos, plain, True)
        torch.testing.assert_close(model._fused(ids, pos, slots.prefill_view(row), True), first, rtol=1e-4, atol=1e-4)
        want.append(model.reference_forward(torch.tensor([[nxt[row]]]), torch.tensor([[len(p)]]), plain, True))
    got = model._fused(torch.tensor(nxt)[:, None], torch.tensor([[3], [4]]), slots.decode_view(2), True)
    torch.testing.assert_close(got, torch.cat(want), rtol=1e-4, atol=1e-4)
