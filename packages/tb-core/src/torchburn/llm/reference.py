"""Each kernel of the protocol as plain PyTorch: the numbers a backend is held to.

tb-llm's reference backend runs these (with faster PyTorch paths where they exist), and
``torchburn.testing.LLMBackendConformance`` checks engine kernels against them.
:class:`ReferenceKernels` bundles them as a backend whose handles are the ``QuantWeight``s
themselves and whose ``linear`` multiplies in float64 on the exactly dequantized weight.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from torchburn.llm.activation import Activation
from torchburn.llm.protocol import PROTOCOL_VERSION, default_head_quant
from torchburn.llm.weights import EmbeddingTable, QuantWeight


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if offset:  # Gemma: scale in fp32, then cast
        return (h * (offset + weight.float())).to(x.dtype)
    return weight * h.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
) -> torch.Tensor:
    b, h, t, d = q.shape
    kv = k.shape[1]
    g = h // kv
    qg = q.reshape(b, kv, g * t, d)  # grouped queries share their KV head without copying it
    s = torch.matmul(qg, k.transpose(-1, -2)).mul_(scale).reshape(b, kv, g, t, -1)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(v.dtype).reshape(b, kv, g * t, -1)
    return torch.matmul(p, v).reshape(b, h, t, d)


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: Activation | str) -> torch.Tensor:
    act = Activation.from_name(act)
    if act is Activation.SILU:
        return F.silu(gate) * up
    if act is Activation.GELU:
        return F.gelu(gate) * up
    return F.gelu(gate, approximate="tanh") * up


def linear(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` in float64 on the exactly dequantized weight, cast to ``x``'s dtype."""
    y = x.double() @ w.dequantize(torch.float64).T
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)


class ReferenceKernels:
    """The protocol's whole surface from the functions above, at one compute dtype."""

    name = "torchburn-reference"
    protocol_version = PROTOCOL_VERSION

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype
        self.device = torch.device("cpu")

    def compute_dtype(self, quant: str) -> torch.dtype:
        return self.dtype

    def head_quant(self, quant: str) -> str:
        return default_head_quant(quant)

    def prepare_linear(self, w: QuantWeight) -> Any:
        return w

    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        return linear(x, handle, bias)

    def embedding(self, ids: torch.Tensor, table: EmbeddingTable) -> torch.Tensor:
        return table.rows(ids, self.dtype)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
        return rms_norm(x, weight, eps, offset)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rope(x, cos, sin)

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
    ) -> torch.Tensor:
        return attention(q, k, v, mask, scale, softcap)

    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: Activation) -> torch.Tensor:
        return gated_act(gate, up, act)
