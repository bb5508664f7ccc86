"""Load-time quantization into the layouts of :mod:`torchburn.llm.weights`.

These functions fix the numbers: an engine that quantizes natively
(``KernelBackend.quantize_linear``) must give bit for bit the handle that
``prepare_linear(quantize(weight, quant, group_size))`` gives.
"""

from __future__ import annotations

import torch

from torchburn.llm.weights import GROUP_SIZES, QUANTS, QuantWeight, pack_int4


def quantize(weight: torch.Tensor, kind: str, group_size: int = 32) -> QuantWeight:
    shape = (int(weight.shape[0]), int(weight.shape[1]))
    if kind == "fp32":
        return QuantWeight("fp32", shape, weight=weight if weight.dtype == torch.float32 else weight.float())
    if kind == "bf16":
        return QuantWeight("bf16", shape, weight=weight.to(torch.bfloat16))
    if kind == "int8" or (kind == "int4" and shape[1] % group_size):
        return quantize_int8(weight)
    if kind == "int4":
        return quantize_int4(weight, group_size)
    raise ValueError(f"unknown quantization {kind!r}; choose one of {', '.join(QUANTS)}")


def quantize_int8(weight: torch.Tensor) -> QuantWeight:
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantWeight("int8", (w.shape[0], w.shape[1]), qweight=q, scales=scales)


def quantize_int4(weight: torch.Tensor, group_size: int = 32) -> QuantWeight:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {GROUP_SIZES}, got {group_size}")
    n, k = weight.shape
    w = weight.float().reshape(n, k // group_size, group_size)
    lo = w.amin(dim=-1)
    hi = w.amax(dim=-1)
    # Scale and zero are rounded to float16 values (the scale's floor is float16's smallest,
    # 2**-24, so it never rounds to 0), and the codes are taken against the rounded pair.
    scales = ((hi - lo) / 15.0).clamp(min=2.0**-24).to(torch.float16).float()
    zeros = (lo + 8.0 * scales).to(torch.float16).float()
    if not (torch.isfinite(scales).all() and torch.isfinite(zeros).all()):
        rows = int((~(torch.isfinite(scales) & torch.isfinite(zeros))).any(dim=-1).sum())
        raise ValueError(
            f"int4: {rows} row(s) have a group whose range is beyond float16 (|value| > 65504), which "
            "int4's float16 scales and zeros cannot hold; quantize this weight to int8 or keep it in bf16 / fp32"
        )
    q = (
        (torch.round((w - zeros.unsqueeze(-1)) / scales.unsqueeze(-1)) + 8.0)
        .clamp_(0, 15)
        .to(torch.uint8)
        .reshape(n, k)
    )
    return QuantWeight("int4", (n, k), qweight=pack_int4(q), scales=scales, zeros=zeros, group_size=group_size)
