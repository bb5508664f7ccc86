"""A decoder model as an engine's whole-model compile receives it: no tb-llm class inside.

:class:`ModelDescription` carries the config scalars, the prepared weights (the handles the
backend's own ``prepare_linear`` returned, or tb-llm's reference handles for weights the backend
declined), the norms as tensors, RoPE as a callable, and the activation as an enum.
:func:`torchburn.llm.model_forward.forward` is its executable meaning: the per-kernel forward pass that
a compiled step must reproduce.

Per layer (pre-norm residual blocks, Llama-style; Gemma 2 adds the "sandwich" norms)::

    h = rms_norm(x, input_norm); q, k, v = qkv(h)          # one fused or three linears
    q, k = rms_norm(q, q_norm), rms_norm(k, k_norm)          # per head, when set (Qwen3)
    q, k = rope(q), rope(k); cache the keys / values
    o = o_proj(attention(q, K, V, mask, attn_scale, attn_softcap))
    sandwich:  x = x + rms_norm(o, post_attn_norm); h = rms_norm(x, pre_ff_norm)
    otherwise: x = x + o;                           h = rms_norm(x, post_attn_norm)
    m = down(act(gate(h)) * up(h));  x = x + (rms_norm(m, post_ff_norm) if sandwich else m)

then ``logits = lm_head(rms_norm(x, norm))``, soft-capped by ``final_softcap`` when set. The
mask lets a query see cached slots whose position is in ``[0, its own]`` (and, in a layer with
``sliding`` set, closer than ``sliding_window``); a query that sees nothing (padding) sees every
slot instead, to stay finite. Every ``rms_norm`` multiplies by ``norm_offset + weight``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from torchburn.llm.activation import Activation
from torchburn.llm.weights import EmbeddingTable

#: ``rope(positions [B, T]) -> (cos, sin)``, each ``[B, T, rotary_dim]`` in the compute dtype
#: ("rotate half" order: both halves repeat the ``rotary_dim / 2`` frequencies). Padding
#: positions (-1) give any finite values.
RopeFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class DeclinedWeight:
    """The handle of a weight the backend's ``prepare_linear`` declined: ``handle`` is what the
    reference prepared instead. A compiled step that meets one knows the weight is not its own."""

    __slots__ = ("handle",)

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return f"DeclinedWeight({type(self.handle).__name__})"


@dataclass
class PreparedLinear:
    """One linear layer: ``y = x @ W.T + bias`` with ``W`` behind ``handle``."""

    handle: Any  # what prepare_linear returned (opaque to all but its backend), or a DeclinedWeight
    bias: torch.Tensor | None
    out_features: int


@dataclass
class DecoderLayer:
    input_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    pre_ff_norm: torch.Tensor | None  # set with post_ff_norm: sandwich norms (Gemma 2)
    post_ff_norm: torch.Tensor | None
    qkv: list[PreparedLinear]  # [q, k, v], or [qkv] with rows q, then k, then v
    o: PreparedLinear
    q_norm: torch.Tensor | None  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    k_norm: torch.Tensor | None
    gate_up: list[PreparedLinear]  # [gate, up], or [gate_up] with the gate rows first
    down: PreparedLinear
    sliding: bool  # the sliding window (when the model sets one) applies in this layer


@dataclass(frozen=True)
class ModelDescription:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    #: ``rms_norm`` multiplies by ``norm_offset + weight`` (Gemma: 1.0)
    norm_offset: float
    attn_scale: float
    attn_softcap: float | None
    final_softcap: float | None
    #: keys at ``query position - key position >= sliding_window`` are hidden in sliding layers
    sliding_window: int | None
    activation: Activation
    #: the embeddings are multiplied by this (rounded to the compute dtype) before layer 0 (Gemma)
    embed_scale: float | None
    rotary_dim: int
    rope: RopeFn = field(repr=False)
    embed: EmbeddingTable = field(repr=False)
    layers: tuple[DecoderLayer, ...] = field(repr=False)
    norm: torch.Tensor = field(repr=False)
    lm_head: PreparedLinear = field(repr=False)
    #: activations, norms, biases and the KV cache are in this dtype
    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "activation", Activation.from_name(self.activation))
        object.__setattr__(self, "layers", tuple(self.layers))
        problems = []
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            problems.append(f"rotary_dim={self.rotary_dim} must be even and at most head_dim={self.head_dim}")
        if problems:
            raise ValueError("ModelDescription: " + "; ".join(problems))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def sandwich_norms(self) -> bool:
        return any(layer.pre_ff_norm is not None for layer in self.layers)

    def linears(self) -> list[PreparedLinear]:
        """Every linear layer, the head last: what a compile checks it prepared itself."""
        found = [lin for layer in self.layers for lin in (*layer.qkv, layer.o, *layer.gate_up, layer.down)]
        return [*found, self.lm_head]
