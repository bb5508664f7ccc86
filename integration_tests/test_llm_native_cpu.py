"""tb-llm on the native_cpu engine's LLM backend, end to end: tiny random checkpoints of every
architecture tb-llm supports, the fused native step against tb-llm's per-kernel path and the
reference backend, greedy tokens against transformers. Needs tb-llm, tb-cpu-rust and
transformers together (the engine's own tests need neither tb-llm nor checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tb_llm import LLM
from tb_llm.testing import ARCHS


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
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
    assert LLM.from_pretrained(ckpt("llama"), device="cpu").backend.name == "native_cpu"


# -- the fused step (compile_model): every layer in one native call ---------------------------
ALL_ARCHS = list(ARCHS)


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_fused_greedy_matches_transformers(ckpt, arch: str) -> None:  # type: ignore[no-untyped-def]
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
                cos = torch.nn.functional.cosine_similarity(
                    g.reshape(-1, g.shape[-1]), w.reshape(-1, w.shape[-1]), dim=-1
                )
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
    model = LLM.from_pretrained(ckpt(arch), quant="fp32", device="cpu", engine="native_cpu").model
    got, _ = _run_steps(model, model._fused, [[1, 2, 3, 4, 5, 6]], 2, last_only=False)
    want, _ = _run_steps(model, model.reference_forward, [[1, 2, 3, 4, 5, 6]], 2, last_only=False)
    assert got[0].shape == (1, 6, model.cfg.vocab_size)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2"])
def test_fused_quantized_top1_agrees_with_reference(ckpt, arch: str, quant: str) -> None:  # type: ignore[no-untyped-def]
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
    llm = LLM.from_pretrained(ckpt(arch), quant="fp32", device="cpu", engine="native_cpu")
    prompts = ["Hi", "The quick brown fox jumps over the lazy dog.", "Hello"]
    batch = llm.generate(prompts, max_new_tokens=14, ignore_eos=True)
    for p, g in zip(prompts, batch):
        assert g.token_ids == llm.generate(p, max_new_tokens=14, ignore_eos=True).token_ids


def test_fused_chat_rewinds_the_cache(ckpt) -> None:  # type: ignore[no-untyped-def]
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


def test_server_slot_caches_take_the_per_kernel_path(ckpt) -> None:  # type: ignore[no-untyped-def]
    """tb-llm's server keeps one cache row per request, each at its own length (SlotCache views):
    the fused step declines those (NotImplemented, before touching them) and tb-llm's forward
    runs them through the per-kernel path, with the same logits as a plain cache."""
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
        assert model._fused(ids, pos, slots.prefill_view(row), True) is NotImplemented
        torch.testing.assert_close(model.forward(ids, pos, slots.prefill_view(row), True), first, rtol=1e-4, atol=1e-4)
        want.append(model.reference_forward(torch.tensor([[nxt[row]]]), torch.tensor([[len(p)]]), plain, True))
    got = model.forward(torch.tensor(nxt)[:, None], torch.tensor([[3], [4]]), slots.decode_view(2), True)
    torch.testing.assert_close(got, torch.cat(want), rtol=1e-4, atol=1e-4)
