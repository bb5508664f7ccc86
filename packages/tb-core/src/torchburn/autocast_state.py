"""The ``torch.autocast`` state a graph was compiled under, for the passes that need it.

Dynamo guards on the global autocast state, so a graph compiled under
``torch.autocast("cpu", dtype=torch.bfloat16)`` only ever runs under it. Three things depend on
that state without seeing it in the graph:

- **Decompositions of fused ops.** ``nn.TransformerEncoderLayer``'s fast path traces as one
  ``aten._transformer_encoder_layer_fwd`` in float32, whatever the autocast state; eager PyTorch
  runs the op's linears and attention in bfloat16 under autocast (its C++ calls ``addmm`` and
  ``_native_multi_head_attention`` through the dispatcher, where autocast casts them). The
  decomposition sees no autocast while it is traced (the dispatcher excludes autocast's keys
  there), so the backend records the state before tracing (``traced_under``) and the
  decomposition reads it (``trace_autocast_dtype``).
- **The graph as traced.** Dynamo's own graph, run in eager PyTorch for the whole-graph route, is
  autocast's input: the same graph means float32 work without autocast and bfloat16 work under
  it, so a stored decision about it is keyed by the state too (``state``).
- **The ATen graph at run time.** A graph traced under autocast already holds autocast's casts;
  AOTAutograd runs such a graph with autocast off, and so does direct inference (``backend``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

#: devices whose autocast state is recorded
DEVICES = ("cpu", "cuda")

_TRACE: ContextVar[dict[str, torch.dtype] | None] = ContextVar("torchburn_trace_autocast", default=None)


def current() -> dict[str, torch.dtype]:
    """The devices with autocast on now, each with its low-precision dtype."""
    on: dict[str, torch.dtype] = {}
    for device in DEVICES:
        try:
            if torch.is_autocast_enabled(device):
                on[device] = torch.get_autocast_dtype(device)
        except (RuntimeError, TypeError):  # a device type this build does not know
            continue
    return on


def state() -> list[str]:
    """``current()`` as a stable list for cache keys (empty without autocast)."""
    return [f"{device}:{dtype}" for device, dtype in sorted(current().items())]


@contextmanager
def traced_under(on: dict[str, torch.dtype]) -> Iterator[None]:
    """Decompositions traced in this block see ``on`` as the autocast state of the graph."""
    token = _TRACE.set(dict(on))
    try:
        yield
    finally:
        _TRACE.reset(token)


def trace_autocast_dtype(device: str) -> torch.dtype | None:
    """The low-precision dtype autocast applies on ``device`` in the graph being traced, or None."""
    on = _TRACE.get()
    return None if on is None else on.get(device)
