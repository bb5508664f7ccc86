"""Adapter and device selection, engine-wide counters, the buffer pool and parameter residency.

One ``GpuContext`` per process holds the wgpu device. It is created lazily on first use and
dropped when the device is lost, so the next compile starts over on a fresh device while the
partitions that were running on the lost one fall back to eager (tb-core's runner does that
when a compiled partition raises).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tb_wgpu.adapters import LIMITS

BACKENDS = {"vulkan": "vulkan", "metal": "metal", "dx12": "d3d12", "d3d12": "d3d12", "gl": "opengl", "opengl": "opengl"}
POWER = ("high-performance", "low-power")

# Buffers are sized in these steps so the pool can hand a freed buffer to the next request.
_ALIGN = 256


class WgpuError(RuntimeError):
    """Base class of the errors the wgpu engine raises."""


class WgpuUnavailableError(WgpuError):
    """No WebGPU adapter could be found or opened."""


class WgpuDeviceLostError(WgpuError):
    """The GPU device was lost (driver reset, device destroyed); the engine opens a new one next compile."""


class WgpuIndexError(WgpuError, IndexError):
    """An index outside its dimension (index, embedding, gather, index_select, nll_loss target):
    the kernels record it and the partition raises after readback instead of returning data."""


class WgpuOutOfMemoryError(WgpuError, MemoryError):
    """A buffer larger than the adapter allows, or the device ran out of memory."""


@dataclass
class Counters:
    submissions: int = 0
    uploads: int = 0
    upload_bytes: int = 0
    param_uploads: int = 0
    readbacks: int = 0
    pipelines_compiled: int = 0
    dispatches: int = 0
    buffers_created: int = 0
    per_tag: dict[str, int] = field(default_factory=lambda: defaultdict(int))


COUNTERS = Counters()


def stats() -> dict[str, int]:
    """Counters since ``reset_stats()``: queue submissions, uploads, readbacks, pipelines built."""
    return {k: v for k, v in vars(COUNTERS).items() if isinstance(v, int)}


def reset_stats() -> None:
    for name, value in vars(Counters()).items():
        setattr(COUNTERS, name, value)


def requested_backend() -> str | None:
    raw = os.environ.get("TORCHBURN_WGPU_BACKEND", "").strip().lower()
    if not raw:
        return None
    if raw not in BACKENDS:
        raise WgpuUnavailableError(f"TORCHBURN_WGPU_BACKEND={raw!r} is not one of vulkan, metal, dx12, gl")
    return BACKENDS[raw]


def requested_power() -> str:
    raw = os.environ.get("TORCHBURN_WGPU_POWER", "high-performance").strip().lower()
    if raw not in POWER:
        raise WgpuUnavailableError(f"TORCHBURN_WGPU_POWER={raw!r} is not one of {', '.join(POWER)}")
    return raw


def _rank(adapter: Any, power: str) -> tuple[int, int]:
    info = adapter.info
    kind = str(info.get("adapter_type", "")).lower()
    backend = str(info.get("backend_type", "")).lower()
    if power == "low-power":
        order = {"integratedgpu": 0, "discretegpu": 1, "virtualgpu": 2, "cpu": 3}
    else:
        order = {"discretegpu": 0, "integratedgpu": 1, "virtualgpu": 2, "cpu": 3}
    # Vulkan/Metal/DX12 before GL: the GL backend lacks storage-buffer features compute needs.
    return order.get(kind, 4), 1 if backend == "opengl" else 0


def _load_llvm_users_first() -> None:
    """Import torch's compiler stack (which loads triton's bundled LLVM) before any Vulkan driver.

    lavapipe links the system libLLVM; loading triton's LLVM after it crashes the process
    (segfault inside triton's module init). Loaded in this order, both coexist.
    """
    with contextlib.suppress(Exception):  # torch without dynamo/triton: nothing to order
        import torch._dynamo  # noqa: F401


def pick_adapter() -> Any:
    """The adapter the engine uses, honouring TORCHBURN_WGPU_BACKEND and TORCHBURN_WGPU_POWER."""
    _load_llvm_users_first()
    try:
        import wgpu
    except Exception as exc:
        raise WgpuUnavailableError(f"the wgpu package cannot be imported ({exc}); pip install wgpu") from exc
    backend = requested_backend()
    power = requested_power()
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:
        raise WgpuUnavailableError(f"no WebGPU adapter: {type(exc).__name__}: {exc}") from exc
    if backend is not None:
        adapters = [a for a in adapters if str(a.info.get("backend_type", "")).lower() == backend]
    if not adapters:
        where = f" for backend {backend}" if backend else ""
        raise WgpuUnavailableError(
            f"no WebGPU adapter{where} (install a Vulkan driver, e.g. Mesa's lavapipe: "
            "apt-get install mesa-vulkan-drivers libvulkan1)"
        )
    adapters.sort(key=lambda a: _rank(a, power))
    return adapters[0]


class GpuContext:
    """The device, its limits, the pipeline cache and the buffer pool."""

    def __init__(self) -> None:
        import wgpu

        self.wgpu = wgpu
        self.adapter = pick_adapter()
        info = self.adapter.info
        self.adapter_name = str(info.get("device", "unknown"))
        self.backend = str(info.get("backend_type", "unknown"))
        self.adapter_type = str(info.get("adapter_type", "unknown"))
        self.shader_f16 = "shader-f16" in self.adapter.features
        # int64 kernels use WGSL i64 with this wgpu-native feature, else vec2<u32> emulation
        # (shaders.with_int64); tests switch it off on a device that has it to run the emulation.
        self.shader_int64 = "shader-int64" in self.adapter.features
        limits = dict(self.adapter.limits)
        # the adapter's own values of the limits the engine reads (adapters.py reports the same ones)
        wanted = {k: limits[k] for k in LIMITS if k in limits}
        features = [f for f, on in (("shader-f16", self.shader_f16), ("shader-int64", self.shader_int64)) if on]
        try:
            self.device = self.adapter.request_device_sync(required_features=features, required_limits=wanted)
        except Exception as exc:
            raise WgpuUnavailableError(f"could not open a device on {self.adapter_name}: {exc}") from exc
        self.limits = dict(self.device.limits)
        self.max_buffer = int(self.limits["max-buffer-size"])
        self.max_binding = int(self.limits["max-storage-buffer-binding-size"])
        self.max_storage_buffers = int(self.limits["max-storage-buffers-per-shader-stage"])
        self.max_workgroups = int(self.limits["max-compute-workgroups-per-dimension"])
        self.max_shared = int(self.limits["max-compute-workgroup-storage-size"])
        self.max_invocations = int(self.limits["max-compute-invocations-per-workgroup"])
        self.queue = self.device.queue
        self.lost = False
        self.lock = threading.RLock()
        self._pool: dict[int, list[Any]] = defaultdict(list)
        self._pipelines: dict[str, Any] = {}
        self._layouts: dict[tuple[int, int], Any] = {}
        self.resident = Residency(self)

    @property
    def is_software(self) -> bool:
        return self.adapter_type.lower() == "cpu" or "llvmpipe" in self.adapter_name.lower()

    def describe(self) -> dict[str, Any]:
        return {
            "adapter": self.adapter_name,
            "backend": self.backend,
            "adapter_type": self.adapter_type,
            "shader-f16": self.shader_f16,
            "shader-int64": self.shader_int64,
            "max_buffer_size": self.max_buffer,
            "max_storage_buffer_binding_size": self.max_binding,
            "max_compute_workgroup_storage_size": self.max_shared,
            "max_compute_invocations_per_workgroup": self.max_invocations,
            "max_compute_workgroups_per_dimension": self.max_workgroups,
        }

    # -- buffers ----------------------------------------------------------------------------
    def check_size(self, nbytes: int, what: str = "tensor") -> None:
        if nbytes > self.max_binding:
            raise WgpuOutOfMemoryError(
                f"a {what} of {nbytes} bytes exceeds the adapter's max storage binding size "
                f"({self.max_binding} bytes on {self.adapter_name}); this partition runs on another engine"
            )

    def acquire(self, nbytes: int) -> Any:
        """A storage buffer of at least ``nbytes`` from the pool (created if none is free)."""
        size = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        self.check_size(size)
        free = self._pool.get(size)
        if free:
            return free.pop()
        return self.create_buffer(size, "storage")

    def release(self, buffer: Any) -> None:
        if not self.lost:
            self._pool[buffer.size].append(buffer)

    def create_buffer(self, size: int, kind: str) -> Any:
        usage = self.wgpu.BufferUsage
        flags = {
            "storage": usage.STORAGE | usage.COPY_DST | usage.COPY_SRC,
            "readback": usage.MAP_READ | usage.COPY_DST,
        }[kind]
        self.ensure_alive()
        try:
            buffer = self.device.create_buffer(size=size, usage=flags)
        except MemoryError as exc:
            raise WgpuOutOfMemoryError(f"the device ran out of memory allocating {size} bytes: {exc}") from exc
        except Exception as exc:
            raise self.translate(exc, f"allocating {size} bytes") from exc
        COUNTERS.buffers_created += 1
        return buffer

    # -- pipelines ---------------------------------------------------------------------------
    def layout(self, n_in: int, n_out: int) -> Any:
        key = (n_in, n_out)
        layout = self._layouts.get(key)
        if layout is None:
            entries = []
            for i in range(n_in + n_out):
                kind = "read-only-storage" if i < n_in else "storage"
                entries.append({"binding": i, "visibility": self.wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}})
            bgl = self.device.create_bind_group_layout(entries=entries)
            layout = (bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]))
            self._layouts[key] = layout
        return layout

    def pipeline(self, key: str, source: str, n_in: int, n_out: int) -> Any:
        cached = self._pipelines.get(key)
        if cached is not None:
            return cached
        if n_in + n_out > self.max_storage_buffers:
            raise WgpuError(
                f"a kernel needs {n_in + n_out} storage buffers; the adapter allows {self.max_storage_buffers}"
            )
        self.ensure_alive()
        _, playout = self.layout(n_in, n_out)
        try:
            module = self.device.create_shader_module(code=source)
            pipe = self.device.create_compute_pipeline(
                layout=playout, compute={"module": module, "entry_point": "main"}
            )
        except Exception as exc:
            raise self.translate(exc, "compiling a WGSL kernel") from exc
        COUNTERS.pipelines_compiled += 1
        self._pipelines[key] = pipe
        return pipe

    # -- errors ------------------------------------------------------------------------------
    def ensure_alive(self) -> None:
        if self.lost:
            raise WgpuDeviceLostError(f"the wgpu device on {self.adapter_name} was lost; recompile to use a new one")

    def mark_lost(self) -> None:
        global _CONTEXT
        self.lost = True
        self._pool.clear()
        with _CONTEXT_LOCK:
            if _CONTEXT is self:
                _CONTEXT = None

    def translate(self, exc: BaseException, doing: str) -> WgpuError:
        if isinstance(exc, WgpuError):
            return exc
        text = str(exc)
        if isinstance(exc, MemoryError) or "out of memory" in text.lower():
            return WgpuOutOfMemoryError(f"the device ran out of memory while {doing}: {text}")
        if "lost" in text.lower() or "destroyed" in text.lower() or "invalid device" in text.lower():
            self.mark_lost()
            return WgpuDeviceLostError(f"the wgpu device on {self.adapter_name} was lost while {doing}: {text}")
        return WgpuError(f"wgpu failed while {doing}: {type(exc).__name__}: {text}")

    def destroy(self) -> None:
        """Destroy the device (tests use this to simulate a device loss)."""
        self.device.destroy()
        self.mark_lost()


class Residency:
    """Parameters kept on the device across calls, re-uploaded when their version or pointer changes."""

    def __init__(self, ctx: GpuContext) -> None:
        self.ctx = ctx
        # id(tensor) -> (weakref, version, data_ptr, buffer)
        self._entries: dict[int, tuple[Any, int, int, Any]] = {}

    def buffer_for(self, tensor: Any, upload: Any) -> Any:
        key = id(tensor)
        entry = self._entries.get(key)
        version = tensor._version
        ptr = tensor.data_ptr()
        if entry is not None and entry[0]() is tensor:
            _, old_version, old_ptr, buffer = entry
            if old_version == version and old_ptr == ptr:
                return buffer
            upload(buffer, tensor)
            COUNTERS.param_uploads += 1
            self._entries[key] = (entry[0], version, ptr, buffer)
            return buffer
        if entry is not None:
            self._forget(key)
        buffer = self.ctx.acquire(_device_nbytes(tensor))
        upload(buffer, tensor)
        COUNTERS.param_uploads += 1
        ref = weakref.ref(tensor, functools.partial(self._forget_ref, key))
        self._entries[key] = (ref, version, ptr, buffer)
        return buffer

    def _forget_ref(self, key: int, _ref: Any) -> None:
        self._forget(key)

    def _forget(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.ctx.release(entry[3])

    def __len__(self) -> int:
        return len(self._entries)


def _device_nbytes(tensor: Any) -> int:
    # float16 and int64 keep their torch width; bool and int32 take a 32-bit word each.
    return max(4, tensor.numel() * {2: 2, 8: 8}.get(tensor.element_size(), 4))


_CONTEXT: GpuContext | None = None
_CONTEXT_LOCK = threading.Lock()
_UNAVAILABLE: str | None = None


def context() -> GpuContext:
    """The process-wide device, opened on first use (raises WgpuUnavailableError when there is none)."""
    global _CONTEXT, _UNAVAILABLE
    with _CONTEXT_LOCK:
        if _CONTEXT is None:
            try:
                _CONTEXT = GpuContext()
                _UNAVAILABLE = None
            except WgpuUnavailableError as exc:
                _UNAVAILABLE = str(exc)
                raise
        return _CONTEXT


def probe() -> tuple[GpuContext | None, str]:
    """(context, "") when an adapter is usable, else (None, reason). Never raises."""
    try:
        return context(), ""
    except Exception as exc:
        return None, str(exc) or type(exc).__name__
