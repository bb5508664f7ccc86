"""native_cpu's lowering: a torchburn ``Plan`` -> the executor's JSON spec.

One table (``registry.LOWERINGS``) maps each ATen op to its lowering; the family modules below
fill it with ``register_lowering`` and are imported here for that effect. What the engine
supports is read from that table (``supported_ops``, ``check``).
"""

from __future__ import annotations

import json
from typing import Any

# the family modules register their lowerings when imported; the dtype families (complex, then
# the wide dtypes) decide on a node in this order
from tb_cpu_rust.lowering import (  # noqa: F401
    attention,
    batch_norm_backward,
    complex,
    conv_backward,
    conv_fusion,
    conv_pool,
    elementwise,
    gemm,
    indexing,
    linalg,
    losses,
    norms,
    reductions,
    scans,
    search,
    views,
    wide,
)
from tb_cpu_rust.lowering.lowerer import Lowerer, finite
from tb_cpu_rust.lowering.registry import LOWERINGS, LoweringError, check, families, register_lowering, supported_ops
from tb_cpu_rust.lowering.steps import SCHEMA_VERSION
from torchburn.plan import Plan

__all__ = [
    "LOWERINGS",
    "SCHEMA_VERSION",
    "Lowerer",
    "LoweringError",
    "check",
    "families",
    "lower",
    "register_lowering",
    "supported_ops",
]


def lower(plan: Plan) -> dict[str, Any]:
    """The executor spec of ``plan``: ``spec`` (buffers, values, steps), its ``json``, the
    ``outputs`` template, and the ``buffers`` / ``values`` / ``n_inputs`` the program binds."""
    result = Lowerer(plan).lower()
    result["json"] = json.dumps(finite(result["spec"]), allow_nan=False)
    return result
