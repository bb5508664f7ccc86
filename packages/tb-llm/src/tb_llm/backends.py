"""Which kernel backend runs a model: an engine's LLM backend, composed with the PyTorch reference.

The protocol an engine implements is tb-core's (``torchburn.llm.protocol``, version
``PROTOCOL_VERSION``), so an engine never imports tb-llm. :func:`select_backend` finds the
engine backends through tb-core's ``tb_register_llm_backends`` hook, refuses one built for
another protocol version with a :class:`BackendError` naming the engine and both versions, and
wraps the one it picks in a :class:`~tb_llm.composed.ComposedBackend`, which runs on
:class:`ReferenceBackend` whatever the engine declines.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from tb_llm.composed import ComposedBackend
from tb_llm.errors import BackendError
from tb_llm.reference_backend import ReferenceBackend
from torchburn.llm.errors import ProtocolVersionError
from torchburn.llm.protocol import PROTOCOL_VERSION, KernelBackend, LLMKernels

__all__ = [
    "PROTOCOL_VERSION",
    "BackendError",
    "ComposedBackend",
    "KernelBackend",
    "LLMKernels",
    "ReferenceBackend",
    "check_protocol_version",
    "resolve_device",
    "select_backend",
]

log = logging.getLogger("tb_llm")


def resolve_device(device: str) -> torch.device:
    """``cpu``, ``gpu`` (CUDA / ROCm / MPS as PyTorch sees them) or ``auto`` (a measured probe).

    ``gpu`` where PyTorch sees no GPU gives the CPU device: the tensors stay in host memory and
    :func:`select_backend` then needs an engine backend that computes on a GPU itself (wgpu).
    """
    if device == "cpu":
        return torch.device("cpu")
    gpu = _gpu_device()
    if device == "gpu":
        return gpu if gpu is not None else torch.device("cpu")
    if device != "auto":
        if device.startswith(("cuda", "mps", "cpu", "xpu")):
            return torch.device(device)
        raise BackendError(f"unknown device {device!r}: use 'auto', 'cpu' or 'gpu'")
    if gpu is None:
        return torch.device("cpu")
    return gpu if _probe(gpu) < _probe(torch.device("cpu")) else torch.device("cpu")


def _gpu_device() -> torch.device | None:
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return None


def _probe(device: torch.device) -> float:
    """Seconds for a few decode-shaped GEMVs: what a token costs, not what the spec sheet says."""
    import time

    w = torch.randn(4096, 4096, device=device)
    x = torch.randn(1, 4096, device=device)
    for _ in range(2):
        y = x @ w.T
    _sync(device)
    start = time.perf_counter()
    for _ in range(8):
        y = y @ w.T
        y = y / y.norm()
    _sync(device)
    return time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def select_backend(device: torch.device, engine: str | None, requested: str = "auto") -> LLMKernels:
    """The backend for ``device``: the named engine's, else the best installed, else the reference.

    ``requested`` is what the user asked for (``auto``/``cpu``/``gpu``). On a PyTorch GPU device
    PyTorch's own kernels run the model unless an engine is named; engine backends of kind
    ``gpu`` (wgpu) take host tensors and serve ``device="gpu"`` where PyTorch has no GPU.
    """
    candidates: list[Any] = []
    if _other_plugins_installed():
        try:
            from torchburn.llm_backend import llm_backends

            candidates = llm_backends()
        except Exception as exc:  # a broken plugin never stops the reference path
            log.debug("listing LLM backends failed: %s", exc)
    if device.type != "cpu" and engine is None:
        return ReferenceBackend(device)  # CUDA / ROCm / MPS through PyTorch
    kind = "gpu" if requested == "gpu" else "cpu"
    if engine is not None and engine not in ("reference", "torch", "eager"):
        named = [b for b in candidates if engine in (b.name, b.engine)]
        if not named:
            have = ", ".join(sorted({b.engine for b in candidates})) or "none"
            raise BackendError(
                f"engine {engine!r} offers no LLM backend (installed engines with one: {have}); "
                "install it, or use engine=None for the PyTorch reference path"
            )
        if device.type != "cpu":
            if requested not in ("auto", "gpu"):
                raise BackendError(
                    f"engine {engine!r} computes on host tensors (its own device, if any), so it cannot be combined "
                    f"with device={requested!r}; use device='auto', 'gpu' or 'cpu' with it, or engine=None for "
                    "PyTorch's kernels on that device"
                )
            # auto / gpu on a machine where PyTorch sees a GPU: the named engine still takes host tensors
            device = torch.device("cpu")
        return _load(named[0], device, strict=True)
    if engine is None:
        for desc in candidates:
            if desc.device == kind:
                backend = _load(desc, device, strict=False)
                if backend is not None:
                    return backend
    if kind == "gpu":
        gpu_engines = ", ".join(sorted({b.engine for b in candidates if b.device == "gpu"})) or "none installed"
        raise BackendError(
            "device='gpu' but PyTorch sees no GPU (CUDA, ROCm or MPS) and no GPU engine backend loaded "
            f"(GPU engines with an LLM backend: {gpu_engines}; e.g. pip install tb-wgpu); "
            "use device='cpu' or 'auto'"
        )
    return ReferenceBackend(device)


def check_protocol_version(desc: Any, obj: Any = None) -> None:
    """Raise :class:`~torchburn.llm.errors.ProtocolVersionError` (a :class:`BackendError`) unless the descriptor ``desc`` (and, once loaded, its backend
    ``obj``) implement this tb-llm's kernel protocol version."""
    versions = [("its descriptor", getattr(desc, "protocol_version", 1))]
    if obj is not None:
        versions.append(("the loaded backend", getattr(obj, "protocol_version", 1)))
    for where, version in versions:
        if version != PROTOCOL_VERSION:
            raise ProtocolVersionError(
                f"LLM backend {desc.name!r} of engine {desc.engine!r} implements LLM kernel protocol "
                f"version {version} ({where} says so), but tb-llm here speaks version {PROTOCOL_VERSION} "
                f"(torchburn.llm.PROTOCOL_VERSION); install releases of the engine's package and of "
                "tb-core / tb-llm that agree, or use engine=None for the PyTorch reference path"
            )


def _load(desc: Any, device: torch.device, strict: bool) -> Any:
    try:
        check_protocol_version(desc)
        obj = desc.load()
        if isinstance(obj, type):
            obj = obj()
        check_protocol_version(desc, obj)
        if not isinstance(obj, KernelBackend):
            raise BackendError(
                f"{type(obj).__name__} is not a torchburn.llm.KernelBackend: it needs a name and a protocol_version"
            )
        return ComposedBackend(obj, ReferenceBackend(device))
    except Exception as exc:
        if strict:
            if isinstance(exc, ProtocolVersionError):
                raise
            raise BackendError(f"LLM backend {desc.name!r} of engine {desc.engine!r} failed to load: {exc}") from exc
        warnings.warn(
            f"tb-llm: LLM backend {desc.name!r} failed to load ({exc}); using the PyTorch reference", stacklevel=3
        )
        return None


def _other_plugins_installed() -> bool:
    """Whether any ``torchburn`` entry point besides tb-llm's own exists. ``import torchburn``
    pulls in ``torch._dynamo`` (seconds), so with nothing to find it is not worth it."""
    import sys
    from importlib import metadata

    if "torchburn" in sys.modules:  # already paid for; may hold plugins registered in process
        return True
    return any(ep.name != "llm" for ep in metadata.entry_points(group="torchburn"))
