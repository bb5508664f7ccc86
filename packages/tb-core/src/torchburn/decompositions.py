"""Decompositions tb-core adds to the Core ATen table.

PyTorch's inference fast paths call fused ops with no Core ATen decomposition (for example
``nn.TransformerEncoderLayer`` in eval mode calls ``aten._transformer_encoder_layer_fwd``).
Engines cannot see inside such an op, so the whole layer would fall back. These functions
express the same computation in ops engines do take: linear, SDPA, layer norm, activations.

Under ``torch.autocast`` a fused op can compute in another dtype than its graph says: eager
PyTorch's ``_transformer_encoder_layer_fwd`` runs its attention and feed-forward linears in
bfloat16 (its C++ reaches ``addmm`` and ``_native_multi_head_attention`` through the dispatcher,
where autocast casts them) and returns bfloat16, while the traced graph types it float32. The
decomposition then writes autocast's casts itself, at the points eager rounds
(``torchburn.autocast_state``), so the compiled layer computes what eager does — in bfloat16 on
the engines' bfloat16 kernels — instead of a float32 layer slower and more exact than eager's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from torchburn.autocast_state import trace_autocast_dtype

aten = torch.ops.aten


def transformer_encoder_layer_fwd(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> Any:
    if mask is not None or src.is_nested or src.dim() != 3:
        return NotImplemented  # masked and nested forms keep PyTorch's own kernel
    batch, length, _ = src.shape
    head_dim = embed_dim // num_heads
    shape = (embed_dim,)
    # eager's order of operations (transformer.cpp): each residual add writes into its left
    # operand, so its result keeps that operand's dtype
    low = _autocast_dtype(src, qkv_weight, proj_weight, ffn_weight_1, ffn_weight_2)

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if low is None:
            return F.linear(x, weight, bias)
        # autocast: operands cast to ``low``, the product rounded to ``low``
        return F.linear(x.to(low), weight.to(low), bias.to(low))

    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if x.dtype == weight.dtype:
            return F.layer_norm(x, shape, weight, bias, eps)
        # a ``low`` input with float32 weights: computed in float32, rounded to the input's dtype
        return F.layer_norm(x.to(weight.dtype), shape, weight, bias, eps).to(x.dtype)

    def add_into(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        out = x + other
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def attention(x: torch.Tensor) -> torch.Tensor:
        qkv = linear(x, qkv_weight, qkv_bias)
        qkv = qkv.view(batch, length, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return linear(out.transpose(1, 2).reshape(batch, length, embed_dim), proj_weight, proj_bias)

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return linear(hidden, ffn_weight_2, ffn_bias_2)

    if norm_first:
        x = add_into(attention(norm(src, norm_weight_1, norm_bias_1)), src)
        return add_into(feed_forward(norm(x, norm_weight_2, norm_bias_2)), x)
    x = norm(add_into(attention(src), src), norm_weight_1, norm_bias_1)
    return norm(add_into(feed_forward(x), x), norm_weight_2, norm_bias_2)


def _autocast_dtype(src: torch.Tensor, *weights: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast runs the layer's linears and attention in, where the graph was traced
    under autocast for ``src``'s device and the layer is float32 (the case autocast changes);
    else None."""
    low = trace_autocast_dtype(src.device.type)
    if low is None or low == torch.float32:
        return None
    if src.dtype != torch.float32 or any(w.dtype != torch.float32 for w in weights):
        return None
    return low


EXTRA_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
}
