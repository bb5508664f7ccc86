"""The forward pass of a :class:`~torchburn.llm.model.ModelDescription`, one kernel call at a time.

tb-llm's per-kernel path is this function over its composed backend; an engine's compiled step
must give its numbers; the conformance suite runs it over
:class:`~torchburn.llm.reference.ReferenceKernels` as the reference for a ``compile_model``.
"""

from __future__ import annotations

import torch

from torchburn.llm.kv_cache import CacheLike
from torchburn.llm.model import ModelDescription
from torchburn.llm.protocol import LLMKernels


def forward(
    model: ModelDescription,
    kernels: LLMKernels,
    ids: torch.Tensor,
    positions: torch.Tensor,
    cache: CacheLike,
    last_only: bool = True,
) -> torch.Tensor:
    """Run ``ids`` ``[B, T]`` at ``positions`` ``[B, T]`` (-1: padding), appending to ``cache``;
    return float32 logits ``[B, V]`` (last position) or ``[B, T, V]``."""
    be = kernels
    b, t = ids.shape
    cache.begin(positions)
    x = be.embedding(ids, model.embed).to(model.dtype)
    if model.embed_scale is not None:
        x = x * torch.tensor(model.embed_scale, dtype=x.dtype)
    cos, sin = model.rope(positions)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    full_mask, window_mask = attention_masks(model, positions, cache)
    h_q, h_kv, d = model.num_heads, model.num_kv_heads, model.head_dim
    eps, off = model.rms_norm_eps, model.norm_offset
    x = x.reshape(b * t, -1)
    for i, layer in enumerate(model.layers):
        r = x
        h = be.rms_norm(x, layer.input_norm, eps, off)
        if len(layer.qkv) == 1:
            qkv = be.linear(h, layer.qkv[0].handle, layer.qkv[0].bias)
            q, k, v = qkv.split((h_q * d, h_kv * d, h_kv * d), dim=-1)
        else:
            q, k, v = (be.linear(h, lin.handle, lin.bias) for lin in layer.qkv)
        q = q.reshape(b, t, h_q, d).transpose(1, 2)
        k = k.reshape(b, t, h_kv, d).transpose(1, 2)
        v = v.reshape(b, t, h_kv, d).transpose(1, 2)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = be.rms_norm(q, layer.q_norm, eps, off)
            k = be.rms_norm(k, layer.k_norm, eps, off)
        q = be.rope(q, cos, sin)
        k = be.rope(k, cos, sin)
        k_all, v_all = cache.write(i, k, v)
        mask = window_mask if layer.sliding and window_mask is not None else full_mask
        o = be.attention(q.contiguous(), k_all, v_all, mask, model.attn_scale, model.attn_softcap)
        o = o.transpose(1, 2).reshape(b * t, h_q * d)
        h = be.linear(o, layer.o.handle, layer.o.bias)
        if layer.pre_ff_norm is not None:
            h = be.rms_norm(h, layer.post_attn_norm, eps, off)
            x = r + h
            r = x
            h = be.rms_norm(x, layer.pre_ff_norm, eps, off)
        else:
            x = r + h
            r = x
            h = be.rms_norm(x, layer.post_attn_norm, eps, off)
        if len(layer.gate_up) == 1:
            gu = be.linear(h, layer.gate_up[0].handle, layer.gate_up[0].bias)
            gate, up = gu.chunk(2, dim=-1)
        else:
            gate = be.linear(h, layer.gate_up[0].handle, layer.gate_up[0].bias)
            up = be.linear(h, layer.gate_up[1].handle, layer.gate_up[1].bias)
        h = be.linear(be.gated_act(gate, up, model.activation), layer.down.handle, layer.down.bias)
        if layer.post_ff_norm is not None:
            h = be.rms_norm(h, layer.post_ff_norm, eps, off)
        x = r + h
    cache.commit(t)
    x = x.reshape(b, t, -1)
    if last_only:
        x = x[:, -1]
    x = be.rms_norm(x, model.norm, eps, off)
    shape = x.shape[:-1]
    logits = be.linear(x.reshape(-1, x.shape[-1]), model.lm_head.handle, None).float().reshape(*shape, -1)
    if model.final_softcap:
        logits = torch.tanh(logits / model.final_softcap) * model.final_softcap
    return logits


def attention_masks(
    model: ModelDescription, positions: torch.Tensor, cache: CacheLike
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The full and the sliding-window mask ``[B, 1, T, S]`` of this step (after ``begin``)."""
    end = cache.length + positions.shape[1]
    kpos = cache.pos[:, :end]  # [B, S]
    qpos = positions  # [B, T]
    valid = (kpos >= 0)[:, None, :]
    diff = qpos[:, :, None] - kpos[:, None, :]
    full = valid & (diff >= 0)
    window = None
    if model.sliding_window is not None and any(layer.sliding for layer in model.layers):
        window = full & (diff < model.sliding_window)
    return _no_empty_rows(full).unsqueeze(1), (_no_empty_rows(window).unsqueeze(1) if window is not None else None)


def _no_empty_rows(mask: torch.Tensor) -> torch.Tensor:
    # A padding query sees no key; letting it see all of them avoids NaN (its output is unused).
    empty = ~mask.any(dim=-1, keepdim=True)
    return mask | empty
