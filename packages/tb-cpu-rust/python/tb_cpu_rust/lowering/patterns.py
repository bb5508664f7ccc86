"""Multi-node patterns the lowerer replaces by one step: each finder matches its pattern on the
plan before any node is lowered (rotary embeddings, written-out RMS norms and tanh GELUs); the lowerer skips a pattern's inner nodes and calls its lowering
at the pattern's last node (``Lowerer.lower``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchburn.plan import Plan


def find_patterns(plan: Plan, uses: dict[int, int]) -> tuple[dict[int, Callable[[Any, Any], int]], set[int]]:
    """(last node index -> lowering(lowerer, out meta), every inner node index) of the plan."""
    from tb_cpu_rust.lowering.gelu_tanh_fusion import TanhGeluMatch, find_tanh_gelus, lower_tanh_gelu
    from tb_cpu_rust.lowering.rms_norm_fusion import RmsNormMatch, find_rms_norms, lower_rms_norm
    from tb_cpu_rust.lowering.rope import Rope, find_ropes, lower_rope

    lowerings: dict[int, Callable[[Any, Any], int]] = {}

    def rope_at(rope: Rope) -> Callable[[Any, Any], int]:
        return lambda lw, out: lower_rope(lw, rope, out)

    def rms_at(rms: RmsNormMatch) -> Callable[[Any, Any], int]:
        return lambda lw, out: lower_rms_norm(lw, rms, out)

    def gelu_at(gelu: TanhGeluMatch) -> Callable[[Any, Any], int]:
        return lambda lw, out: lower_tanh_gelu(lw, gelu, out)

    inner: set[int] = set()
    for k, rope in find_ropes(plan, uses).items():
        lowerings[k] = rope_at(rope)
        inner |= rope.inner
    for k, rms in find_rms_norms(plan, uses).items():
        if k in lowerings or k in inner or rms.inner & (inner | set(lowerings)):
            continue  # overlapping matches: the first one found is kept
        lowerings[k] = rms_at(rms)
        inner |= rms.inner
    for k, gelu in find_tanh_gelus(plan, uses).items():
        if k in lowerings or k in inner or gelu.inner & (inner | set(lowerings)):
            continue
        lowerings[k] = gelu_at(gelu)
        inner |= gelu.inner
    return lowerings, inner
