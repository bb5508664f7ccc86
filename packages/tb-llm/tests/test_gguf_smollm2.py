"""The real checkpoint: SmolLM2-135M-Instruct Q4_1 (Llama architecture) against transformers
loading the same GGUF file (``gguf_file=``): tokenizer ids, and greedy tokens at fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tb_llm import LLM
from tb_llm.llm import Generation

pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers needs it to load GGUF weights

PROMPTS: list[Any] = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    [{"role": "user", "content": "Give me three tips for learning to cook."}],
]
NEW_TOKENS = 24
TEXTS = [
    "Hello, world!",
    "  leading spaces and    runs of   whitespace\n\n\ttabs\r\n",
    "Grüße aus München — naïve café, 日本語のテキスト, emoji 🙂🚀",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "code: def f(x):\n    return x*x  # square",
    "",
    " ",
    "don't can't it's we'll",
]


@pytest.fixture(scope="session")
def hf_tokenizer(smollm2_gguf: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def fp32(smollm2_gguf: Path) -> LLM:
    return LLM.from_pretrained(smollm2_gguf, device="cpu")


@pytest.fixture(scope="session")
def fp32_greedy(fp32: LLM) -> list[list[int]]:
    out = []
    for p in PROMPTS:
        g = fp32.generate(p, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        assert isinstance(g, Generation)
        out.append(g.token_ids)
    return out


@pytest.fixture(scope="session")
def hf_next_tokens(smollm2_gguf: Path, fp32: LLM, fp32_greedy: list[list[int]]) -> list[list[int]]:
    """transformers' argmax after every position of prompt + tb-llm's greedy continuation, from
    one forward pass per prompt: equal to the continuation everywhere <=> the same greedy tokens
    (by induction over positions), for the cost of one prefill instead of 24 decode steps."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for p, cont in zip(PROMPTS, fp32_greedy, strict=True):
            ids = torch.tensor([fp32.encode(p) + cont])
            out.append(model(ids, use_cache=False).logits[0].argmax(-1).tolist())
    return out


def test_tokenizer_matches_transformers(fp32: LLM, hf_tokenizer: Any) -> None:
    for text in TEXTS:
        assert fp32.encode(text) == hf_tokenizer.encode(text), repr(text)
        ids = fp32.encode(text)
        assert fp32.tokenizer is not None
        assert fp32.tokenizer.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids), repr(text)
    chat = PROMPTS[2]
    want = hf_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    assert fp32.encode(chat) == list(getattr(want, "input_ids", want))
    tok = fp32.tokenizer
    assert tok is not None and tok.eos_token_ids == (2,) and tok.bos_token_id == 1


def test_digits_split_one_by_one(fp32: LLM) -> None:
    # tokenizer.ggml.pre = "smollm": llama.cpp (and SmolLM2's own tokenizer.json) split every
    # digit; transformers' GGUF tokenizer does not, so digits are checked on their own here.
    assert fp32.tokenizer is not None
    ids = fp32.encode("2024")
    assert [fp32.tokenizer.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_fp32_greedy_matches_transformers(
    fp32: LLM, fp32_greedy: list[list[int]], hf_next_tokens: list[list[int]]
) -> None:
    info = fp32.info()
    assert info["architecture"] == "llama" and info["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert info["loaded_as"] == {"F32": {"kept": 61}, "Q4_1": {"dequantized": 210}, "Q8_0": {"dequantized": 1}}
    for p, cont, hf in zip(PROMPTS, fp32_greedy, hf_next_tokens, strict=True):
        n = len(fp32.encode(p))
        assert len(cont) == NEW_TOKENS
        assert hf[n - 1 : n - 1 + NEW_TOKENS] == cont, (p, fp32.tokenizer.decode(cont) if fp32.tokenizer else cont)


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_runs_and_agrees(
    quant: str, smollm2_gguf: Path, fp32: LLM, fp32_greedy: list[list[int]], hf_next_tokens: list[list[int]]
) -> None:
    llm = LLM.from_pretrained(smollm2_gguf, device="cpu", quant=quant)
    loaded = llm.info()["loaded_as"]
    if quant == "int8":
        assert loaded["Q4_1"] == {"requantized": 210}
    else:  # most Q4_1 tensors of this file are held exactly by int4
        assert loaded["Q4_1"].get("kept", 0) > 100 and sum(loaded["Q4_1"].values()) == 210
    # top-1 agreement with transformers' fp32, teacher-forced over the fp32 greedy continuations
    agree = total = 0
    for p, cont, hf in zip(PROMPTS, fp32_greedy, hf_next_tokens, strict=True):
        ids = fp32.encode(p) + cont
        t = torch.tensor([ids])
        pos = torch.arange(len(ids)).unsqueeze(0)
        mine = llm.model.forward(t, pos, llm.model.new_cache(1, len(ids) + 1), last_only=False)[0].argmax(-1)
        n = len(ids) - len(cont) - 1
        agree += sum(int(a == b) for a, b in zip(mine[n:].tolist(), hf[n:], strict=True))
        total += len(ids) - n
    rate = agree / total
    print(f"SmolLM2 {quant} from the Q4_1 GGUF: top-1 agreement with fp32 {rate:.1%} over {total} positions; {loaded}")
    assert rate > 0.6, rate
    g = llm.generate(PROMPTS[0], max_new_tokens=8)
    assert isinstance(g, Generation) and g.text.strip()
