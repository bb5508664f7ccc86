"""LLM.score and ``tb-llm perplexity`` against log_softmax of transformers' logits, window by
window as llama-perplexity cuts the text."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tb_llm import LLM
from tb_llm.perplexity import plan_windows
from tb_llm.testing import CORPUS

TEXT = " ".join(CORPUS) * 3


def ref_window(hf_model: Any, chunk: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([chunk]), use_cache=False).logits[0].float(), dim=-1)


def test_short_text_scores_every_token_but_the_first(llama: LLM, hf_model: Any) -> None:
    text = "The quick brown fox jumps over the lazy dog"
    s = llama.score(text)
    ids = llama.encode(text)
    assert s.token_ids == ids and s.windows == 1 and s.logprobs[0] is None
    ref = ref_window(hf_model, ids)
    want = ref[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(s.logprobs[1:]), want, atol=1e-4, rtol=1e-4)
    assert s.perplexity == pytest.approx(math.exp(-float(want.mean())), rel=1e-4)
    assert s.scored == len(ids) - 1
    assert llama.score(ids).logprobs == s.logprobs  # token ids score the same


def test_chunks_score_their_second_half_with_bos(llama: LLM, hf_model: Any) -> None:
    ids = llama.encode(TEXT)
    ctx = 16
    s = llama.score(TEXT, ctx=ctx)
    chunks = len(ids) // ctx
    assert chunks >= 3 and s.windows == chunks and s.stride is None
    assert s.scored == chunks * (ctx - ctx // 2 - 1)
    bos = llama.tokenizer.bos_token_id if llama.tokenizer else None
    assert bos is not None
    for c in range(chunks):
        chunk = ids[c * ctx : (c + 1) * ctx]
        ref = ref_window(hf_model, [bos, *chunk[1:]])
        for j in range(ctx):
            got = s.logprobs[c * ctx + j]
            if j <= ctx // 2:
                assert got is None
            else:
                assert got == pytest.approx(float(ref[j - 1, chunk[j]]), abs=1e-4)
    assert all(lp is None for lp in s.logprobs[chunks * ctx :])  # the tail past the last chunk
    assert s.chunk_perplexities[-1] == pytest.approx(s.perplexity)


def test_stride_windows_score_their_last_stride(llama: LLM, hf_model: Any) -> None:
    ids = llama.encode(TEXT)
    ctx, stride = 16, 5
    s = llama.score(TEXT, ctx=ctx, stride=stride)
    windows = (len(ids) - ctx + stride - 1) // stride
    assert s.windows == windows and s.scored == windows * stride
    for w in range(windows):
        chunk = ids[w * stride : w * stride + ctx]
        ref = ref_window(hf_model, chunk)  # run as it is: no BOS put in
        for j in range(ctx - stride, ctx):
            assert s.logprobs[w * stride + j] == pytest.approx(float(ref[j - 1, chunk[j]]), abs=1e-4)
    nll = [-lp for lp in s.logprobs if lp is not None]
    mean = sum(nll) / len(nll)
    assert s.perplexity == pytest.approx(math.exp(mean))
    var = sum(v * v for v in nll) / len(nll) - mean * mean
    assert s.perplexity_stderr == pytest.approx(math.sqrt(var / (len(nll) - 1)) * math.exp(mean))


def test_window_plan_counts() -> None:
    assert [(w.start, w.first_scored) for w in plan_windows(1000, 256, None, True)] == [
        (0, 129),
        (256, 129),
        (512, 129),
    ]
    plan = plan_windows(1000, 256, 64, False)
    assert len(plan) == math.ceil((1000 - 256) / 64) and plan[-1].start + 256 <= 1000
    assert plan_windows(10, 256, None, True) == plan_windows(10, 256, 64, True)  # fits: one window


def test_score_errors(llama: LLM) -> None:
    with pytest.raises(ValueError, match="stride"):
        llama.score(TEXT, ctx=16, stride=16)
    with pytest.raises(ValueError, match="context size"):
        llama.score(TEXT, ctx=1)
    with pytest.raises(ValueError, match="context length"):
        llama.score(TEXT, ctx=llama.config.max_position + 1)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        llama.score([1])
    with pytest.raises(ValueError, match="token ids"):
        llama.score([1, llama.config.vocab_size])


def test_perplexity_command(llama: LLM, llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tb_llm.cli import main

    f = tmp_path / "text.txt"
    f.write_text(TEXT, encoding="utf-8")
    base = ["perplexity", "--model", str(llama_dir), "--device", "cpu", "--file", str(f)]
    assert main([*base, "--ctx", "16", "--stride", "5"]) == 0
    out = capsys.readouterr().out
    want = llama.score(TEXT, ctx=16, stride=5)
    assert f"Final estimate: PPL = {want.perplexity:.4f} +/- {want.perplexity_stderr:.5f}" in out
    assert "[1]" in out
    assert main([*base, "--ctx", "4096"]) == 2
    assert "needs at least 8192" in capsys.readouterr().err
