"""Accuracy of a quantized model against its fp32 original, teacher-forced on one sequence."""

from __future__ import annotations

from typing import Any

import torch


def full_logits(llm: Any, ids: list[int]) -> torch.Tensor:
    cache = llm.model.new_cache(1, len(ids))
    pos = torch.arange(len(ids))[None]
    return llm.model.forward(torch.tensor([ids]), pos, cache, last_only=False)[0].float()


def compare(ref: Any, quant: Any, n_tokens: int = 64, prompt: str = "The quick brown fox") -> tuple[float, float]:
    """(top-1 agreement, mean logit cosine) over the prompt plus ``n_tokens`` of the fp32
    model's greedy continuation, both models reading the same tokens."""
    ids = ref.encode(prompt)
    ids = ids + ref.generate(ids, max_new_tokens=n_tokens, ignore_eos=True).token_ids
    a, b = full_logits(ref, ids), full_logits(quant, ids)
    top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())
    return top1, cos
