"""The example engine's LLM backend: a template for an engine that offers tb-llm kernels.

It implements tb-core's kernel protocol (``torchburn.llm.protocol``, version 2) in plain
PyTorch, as a stand-in for real kernels, and never imports tb-llm. It shows each way a backend
hands work back to tb-llm's reference path:

* ``attention`` is not defined at all: the reference runs every call;
* ``prepare_linear`` declines int8 / int4 weights with ``NotImplemented``: the reference keeps
  them (and runs their ``linear``); ``linear`` here only sees the dense weights it prepared;
* ``rms_norm`` / ``rope`` / ``gated_act`` decline activations that are not float32.

``torchburn.testing.LLMBackendConformance`` checks it (``tests/test_example_llm_backend.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from torchburn.llm import Activation, QuantWeight


class DenseWeight:
    """A prepared fp32 / bf16 weight, widened to float32 once (this backend computes in float32)."""

    __slots__ = ("weight",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight


class ExampleLLMBackend:
    name = "example"
    protocol_version = 2

    def compute_dtype(self, quant: str) -> torch.dtype:
        return torch.float32

    def prepare_linear(self, w: QuantWeight) -> Any:
        if w.kind not in ("fp32", "bf16") or w.weight is None:
            return NotImplemented
        return DenseWeight(w.weight.float().contiguous())

    def linear(self, x: torch.Tensor, handle: DenseWeight, bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[-1] != handle.weight.shape[1]:
            raise ValueError(f"linear: x has {x.shape[-1]} features, the weight takes {handle.weight.shape[1]}")
        return F.linear(x.float(), handle.weight, None if bias is None else bias.float())

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
        if x.dtype != torch.float32:
            return NotImplemented
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + weight.float())

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return NotImplemented
        r = cos.shape[-1]  # the first r dims rotate ("rotate half" order), the rest pass through
        rot, rest = x[..., :r], x[..., r:]
        half = r // 2
        rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        return torch.cat((rot * cos + rotated * sin, rest), dim=-1)

    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: Activation) -> torch.Tensor:
        if gate.dtype != torch.float32:
            return NotImplemented
        if act is Activation.SILU:
            return F.silu(gate) * up
        return F.gelu(gate, approximate="tanh" if act is Activation.GELU_TANH else "none") * up
