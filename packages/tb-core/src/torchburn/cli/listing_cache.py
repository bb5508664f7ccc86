"""``torchburn engines``' listing, remembered across processes.

Listing engines live means loading every plugin, and every engine imports torch: about a second
before anything is printed. The listing depends on little besides the installed code, so the
last one is kept in ``user_cache_dir()/engines.json`` under a fingerprint of everything that can
change it, computed without importing torch or any plugin:

* the interpreter, tb-core's version and source files (names, sizes, modification times);
* torch's version and its ``__init__`` file;
* every ``torchburn`` entry point (name, target, distribution and version) and the source files of
  the package it loads (an editable install or a rebuilt extension changes them without a
  version bump);
* the variables that steer engines (``TORCHBURN_*``, thread counts, GPU and Vulkan selection);
* the CPU (model, flags, cores this process may use) and the OS;
* the GPU drivers: Vulkan driver manifests and the libraries they name, the NVIDIA driver version.

A listing older than ``MAX_AGE_S`` is probed again anyway (facts a fingerprint cannot see), as is
one that does not parse. ``torchburn engines --refresh`` and ``torchburn doctor`` always probe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from importlib import metadata, util
from pathlib import Path
from typing import Any

from torchburn.paths import user_cache_dir

CACHE_FILE = "engines.json"
FORMAT = 1
MAX_AGE_S = 24 * 3600

#: Variables that change which engines are available, in force, or what they report.
STEERING_PREFIXES = ("TORCHBURN_", "OMP_", "MKL_", "CUDA_", "HIP_", "ROCR_", "VK_", "WGPU_")
#: Where the Vulkan loader looks for driver manifests (besides XDG_DATA_DIRS / XDG_CONFIG_DIRS).
ICD_DIRS = ("/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/usr/share/vulkan/icd.d")
_SOURCE_SUFFIXES = (".py", ".so", ".pyd", ".dylib", ".json", ".wgsl")


def fingerprint() -> dict[str, Any]:
    """Everything the listing depends on that can be read without importing torch or a plugin."""
    plugins = []
    for ep in sorted(metadata.entry_points(group="torchburn"), key=lambda e: (e.name, e.value)):
        plugins.append(
            [ep.name, ep.value, _distribution(ep.dist), _package_files(ep.value.split(":")[0].split(".")[0])]
        )
    return {
        "format": FORMAT,
        "python": [sys.executable, sys.version],
        "tb-core": [_version("tb-core"), _package_files("torchburn")],
        "torch": [_version("torch"), _origin_stat("torch")],
        "plugins": plugins,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(STEERING_PREFIXES)},
        "cpu": _cpu(),
        "os": platform.platform(),
        "gpu": _gpu_drivers(),
    }


def load(key: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The remembered listing (``collect()``'s dict plus ``probed_at``), or None when there is
    none, it does not parse, it is older than ``MAX_AGE_S``, or its fingerprint differs."""
    path = _path()
    if path is None:
        return None
    try:
        entry = json.loads(path.read_text())
        listing = entry["listing"]
        if not isinstance(listing, dict) or time.time() - float(entry["probed_at"]) > MAX_AGE_S:
            return None
        if entry["fingerprint"] != (key if key is not None else fingerprint()):
            return None
        return {**listing, "probed_at": float(entry["probed_at"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(listing: dict[str, Any], key: dict[str, Any] | None = None) -> None:
    """Remember a live listing; a read-only or absent cache folder only costs the next run a probe."""
    path = _path()
    if path is None:
        return
    entry = {
        "fingerprint": key if key is not None else fingerprint(),
        "probed_at": time.time(),
        "listing": listing,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".engines-")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, default=str)
        os.replace(tmp, path)  # concurrent writers leave one whole file
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)


def _path() -> Path | None:
    folder = user_cache_dir()
    return None if folder is None else folder / CACHE_FILE


def _distribution(dist: metadata.Distribution | None) -> str:
    """Which distribution, at which version: the ``name-version.dist-info`` folder it was read from
    (parsing its metadata for the two would cost a few ms per plugin), else its parsed metadata."""
    if dist is None:
        return ""
    folder = getattr(dist, "_path", None)  # a PathDistribution, what a site-packages install is
    if isinstance(folder, Path):
        return str(folder)
    return f"{dist.name}=={dist.version}"


def _version(dist: str) -> str:
    try:
        return _distribution(metadata.distribution(dist))
    except metadata.PackageNotFoundError:
        return ""


def _origin_stat(package: str) -> list[Any]:
    """The file a top-level package loads from (found without importing it), with size and mtime."""
    try:
        spec = util.find_spec(package)
    except (ImportError, ValueError):
        return [package, None]
    origin = spec.origin if spec is not None else None
    return _stat(Path(origin)) if origin else [package, None]


def _package_files(package: str) -> str:
    """A digest of the names, sizes and mtimes of a top-level package's source and extension files."""
    try:
        spec = util.find_spec(package)
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin:
        return ""
    origin = Path(spec.origin)
    if origin.name != "__init__.py":
        files = [origin]
    else:
        files = []
        for dirpath, dirs, names in os.walk(origin.parent):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(dirpath, n) for n in sorted(names) if n.endswith(_SOURCE_SUFFIXES)]
    digest = hashlib.blake2b(digest_size=12)
    for path in files:
        digest.update(json.dumps(_stat(path)).encode())
    return digest.hexdigest()


def _stat(path: Path) -> list[Any]:
    try:
        st = path.stat()
    except OSError:
        return [str(path), None, None]
    return [str(path), st.st_size, st.st_mtime_ns]


def _cpu() -> list[Any]:
    facts: list[Any] = [platform.machine(), os.cpu_count()]
    with contextlib.suppress(AttributeError, OSError):
        facts.append(len(os.sched_getaffinity(0)))
    seen: dict[str, str] = {}  # the first CPU's model and flags (an ISA change changes the kernels)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name = line.split(":", 1)[0].strip()
                if name in ("model name", "flags", "Features") and name not in seen:
                    seen[name] = line.strip()
                if line.strip() == "":
                    break
    except OSError:
        pass
    return [*facts, *seen.values()]


def _gpu_drivers() -> list[Any]:
    dirs = list(ICD_DIRS)
    for var, default in (("XDG_DATA_DIRS", "/usr/local/share:/usr/share"), ("XDG_CONFIG_DIRS", "/etc/xdg")):
        dirs += [f"{d}/vulkan/icd.d" for d in os.environ.get(var, default).split(os.pathsep) if d]
    dirs.append(f"{os.environ.get('XDG_DATA_HOME') or os.path.expanduser('~/.local/share')}/vulkan/icd.d")
    facts: list[Any] = []
    for folder in dict.fromkeys(dirs):
        try:
            manifests = sorted(p for p in Path(folder).iterdir() if p.suffix == ".json")
        except OSError:
            continue
        for manifest in manifests:
            facts.append(_stat(manifest))
            try:
                library = Path(json.loads(manifest.read_text())["ICD"]["library_path"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            facts.append(_stat(library) if library.is_absolute() else str(library))
    with contextlib.suppress(OSError):
        facts.append(Path("/proc/driver/nvidia/version").read_text().strip())
    return facts
