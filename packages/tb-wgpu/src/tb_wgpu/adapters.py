"""What the engine needs to know about the WebGPU adapter before it opens a device.

Engine selection (``priority``, ``is_available``) and the partitioner's ``check`` only need the
adapter's name, type, optional features and limits. Opening a device for that cost about a second
on lavapipe in every process, even when another engine was chosen. So the adapter is enumerated at
most once per process, without a device, and what was found is remembered across processes in the
user's cache folder (``torchburn.cache.user_cache_dir()``), under a fingerprint of everything that
can change the answer: the wgpu and tb-wgpu versions, the Vulkan driver manifests and the libraries
they name (paths, sizes, modification times), the NVIDIA kernel driver version, the variables that
steer the choice, and the OS. A fingerprint that differs, or a file that does not parse, means a
fresh enumeration. The device itself is opened only when a partition is compiled (``device.context``).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import threading
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

CACHE_FILE = "wgpu-adapter.json"
FORMAT = 1

#: Variables that change which adapter is found or chosen.
STEERING = (
    "TORCHBURN_WGPU_BACKEND",
    "TORCHBURN_WGPU_POWER",
    "VK_ICD_FILENAMES",
    "VK_DRIVER_FILES",
    "VK_ADD_DRIVER_FILES",
    "WGPU_BACKEND_TYPE",
)
#: Where the Vulkan loader looks for driver manifests (besides XDG_DATA_DIRS / XDG_CONFIG_DIRS).
ICD_DIRS = ("/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/usr/share/vulkan/icd.d")
#: Limits the engine reads; device.py opens the device with the adapter's own values of these.
LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroups-per-dimension",
)


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    backend: str
    adapter_type: str
    shader_f16: bool
    shader_int64: bool
    limits: dict[str, int]

    @property
    def is_software(self) -> bool:
        return self.adapter_type.lower() == "cpu" or "llvmpipe" in self.name.lower()

    @property
    def max_binding(self) -> int:
        return int(self.limits.get("max-storage-buffer-binding-size", 1 << 27))

    @classmethod
    def of(cls, adapter: Any) -> AdapterInfo:
        info, limits, features = adapter.info, dict(adapter.limits), adapter.features
        return cls(
            name=str(info.get("device", "unknown")),
            backend=str(info.get("backend_type", "unknown")),
            adapter_type=str(info.get("adapter_type", "unknown")),
            shader_f16="shader-f16" in features,
            shader_int64="shader-int64" in features,
            limits={k: int(limits[k]) for k in LIMITS if k in limits},
        )


_lock = threading.Lock()
_found: tuple[AdapterInfo | None, str] | None = None
#: How this process learnt it: "enumerated" or "cache" (for tests and ``describe``).
source = ""


def adapter_info() -> tuple[AdapterInfo | None, str]:
    """(the adapter the engine would use, "") or (None, why there is none). Never raises, never opens a device."""
    global _found, source
    with _lock:
        if _found is None:
            cached = _read_cache()
            if cached is not None:
                _found, source = cached, "cache"
            else:
                _found, source = _enumerate(), "enumerated"
                _write_cache(_found)
        return _found


def forget() -> None:
    """Drop this process's answer (the next call reads the cache or enumerates again)."""
    global _found, source
    with _lock:
        _found, source = None, ""


def _enumerate() -> tuple[AdapterInfo | None, str]:
    from tb_wgpu.device import pick_adapter

    try:
        return AdapterInfo.of(pick_adapter()), ""
    except Exception as exc:
        return None, str(exc) or type(exc).__name__


# -- the cross-process cache ----------------------------------------------------------------
def fingerprint() -> dict[str, Any]:
    """Everything an adapter list depends on, cheap to compute (no wgpu import)."""

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return ""

    manifests: list[Any] = []
    for folder in _icd_dirs():
        try:
            names = sorted(p for p in Path(folder).iterdir() if p.suffix == ".json")
        except OSError:
            continue
        manifests.extend(_manifest(p) for p in names)
    for var in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES"):
        manifests.extend(_manifest(Path(p)) for p in os.environ.get(var, "").split(os.pathsep) if p)
    nvidia = ""
    with contextlib.suppress(OSError):
        nvidia = Path("/proc/driver/nvidia/version").read_text().strip()
    return {
        "format": FORMAT,
        "wgpu": version("wgpu"),
        "tb-wgpu": version("tb-wgpu"),
        "os": platform.platform(),
        "env": {k: os.environ.get(k, "") for k in STEERING},
        "manifests": manifests,
        "nvidia": nvidia,
    }


def _icd_dirs() -> list[str]:
    dirs = list(ICD_DIRS)
    for var, default in (("XDG_DATA_DIRS", "/usr/local/share:/usr/share"), ("XDG_CONFIG_DIRS", "/etc/xdg")):
        dirs += [f"{d}/vulkan/icd.d" for d in os.environ.get(var, default).split(os.pathsep) if d]
    home = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    dirs.append(f"{home}/vulkan/icd.d")
    return list(dict.fromkeys(dirs))


def _stat(path: Path) -> list[Any]:
    try:
        st = path.stat()
    except OSError:
        return [str(path), None, None]
    return [str(path), st.st_size, st.st_mtime_ns]


def _manifest(path: Path) -> list[Any]:
    """A driver manifest's file facts and those of the library it names (an upgrade changes both)."""
    facts = _stat(path)
    try:
        library = json.loads(path.read_text())["ICD"]["library_path"]
    except (OSError, ValueError, KeyError, TypeError):
        return facts
    lib = Path(library)
    return facts + (_stat(lib) if lib.is_absolute() else [str(library)])


def _cache_path() -> Path | None:
    from torchburn.cache import user_cache_dir

    folder = user_cache_dir()
    return None if folder is None else folder / CACHE_FILE


def _read_cache() -> tuple[AdapterInfo | None, str] | None:
    path = _cache_path()
    if path is None:
        return None
    try:
        entry = json.loads(path.read_text())
        if entry["fingerprint"] != fingerprint():
            return None
        adapter = entry["adapter"]
        return (AdapterInfo(**adapter) if adapter is not None else None), str(entry["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, corrupt or from another format: enumerate and rewrite it


def _write_cache(found: tuple[AdapterInfo | None, str]) -> None:
    path = _cache_path()
    if path is None:
        return
    adapter, reason = found
    entry = {"fingerprint": fingerprint(), "adapter": asdict(adapter) if adapter else None, "reason": reason}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".wgpu-adapter-")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)  # concurrent writers leave one whole file
    except OSError:
        pass  # a read-only cache folder only costs the next process an enumeration
