"""The op catalog: every ATen op overload an engine may be handed, with its category.

The catalog is data. ``CORE_ATEN_OPS`` is generated from ``torch.Tag.core``; ``KEPT_OPS`` are
the ops tb-core deliberately keeps out of the decomposition table so engines see them whole
(a fused GELU backward or a flash-attention call is worth more to an engine than its pieces);
``UNDECOMPOSED_OPS`` are non-core ops PyTorch has no decomposition for, so they reach engines
whole all the same (``F.adaptive_max_pool2d``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchburn.catalog.core_aten import CORE_ATEN_OPS

KEPT_OPS: tuple[tuple[str, str], ...] = (
    ("aten.silu.default", "elementwise_unary"),
    ("aten.baddbmm.default", "gemm"),
    ("aten.logsumexp.default", "reduction"),
    ("aten._scaled_dot_product_flash_attention_for_cpu.default", "attention"),
    ("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", "backward"),
    ("aten.threshold_backward.default", "backward"),
    ("aten.gelu_backward.default", "backward"),
    ("aten.silu_backward.default", "backward"),
    ("aten.sigmoid_backward.default", "backward"),
    ("aten.tanh_backward.default", "backward"),
    ("aten._softmax_backward_data.default", "backward"),
    ("aten._log_softmax_backward_data.default", "backward"),
    ("aten.native_layer_norm_backward.default", "backward"),
    ("aten.native_batch_norm_backward.default", "backward"),
    ("aten.nll_loss_forward.default", "loss"),
    ("aten.nll_loss_backward.default", "backward"),
    ("aten._fused_rms_norm.default", "normalization"),
)

UNDECOMPOSED_OPS: tuple[tuple[str, str], ...] = (
    ("aten.adaptive_max_pool2d.default", "conv_pool"),
    ("aten.cummax.default", "reduction"),
    ("aten.cummin.default", "reduction"),
    ("aten.adaptive_max_pool3d.default", "conv_pool"),
)


@dataclass(frozen=True)
class CatalogEntry:
    op: str
    category: str
    core: bool


def _build() -> dict[str, CatalogEntry]:
    entries = {op: CatalogEntry(op, cat, True) for op, cat in CORE_ATEN_OPS}
    for op, cat in KEPT_OPS + UNDECOMPOSED_OPS:
        entries.setdefault(op, CatalogEntry(op, cat, False))
    return entries


CATALOG: dict[str, CatalogEntry] = _build()


def category(op: str) -> str:
    """Category of an op overload name such as ``"aten.add.Tensor"``; ``"other"`` if unknown."""
    entry = CATALOG.get(op)
    return entry.category if entry else "other"


def kept_op_names() -> tuple[str, ...]:
    return tuple(op for op, _ in KEPT_OPS)


__all__ = ["CATALOG", "CORE_ATEN_OPS", "KEPT_OPS", "UNDECOMPOSED_OPS", "CatalogEntry", "category", "kept_op_names"]
