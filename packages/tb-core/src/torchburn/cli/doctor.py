"""``torchburn doctor``: versions, CPU features, GPU adapters, plugins, cache, environment."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform

from torchburn.cli.command import Command

CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "sve",
)


def cpu_features() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in CPU_FLAGS if flag in present]
    except OSError:
        pass
    return []


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_adapters() -> list[str]:
    # Load torch's compiler stack (and the LLVM that triton bundles) before a Vulkan driver
    # that links the system LLVM: in the other order, lavapipe + triton crash the process.
    with contextlib.suppress(Exception):
        import torch._dynamo  # noqa: F401
    try:
        import wgpu  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return ["(wgpu not installed: pip install tb-wgpu to use Vulkan/Metal/DX12 GPUs)"]
    try:
        adapters = wgpu.gpu.enumerate_adapters_sync()
        out = []
        for a in adapters:
            info = a.info
            out.append(f"{info.get('device', '?')} [{info.get('backend_type', '?')}, {info.get('adapter_type', '?')}]")
        return out or ["no adapter found"]
    except Exception as exc:
        return [f"adapter enumeration failed: {type(exc).__name__}: {exc}"]


def run(args: argparse.Namespace) -> int:
    import torch

    import torchburn
    from torchburn.cli import engines as engines_cmd

    print(f"tb-core        {torchburn.__version__} (plugin API {torchburn.PLUGIN_API_VERSION})")
    print(f"python         {platform.python_version()} ({platform.platform()})")
    print(f"torch          {torch.__version__} (threads {torch.get_num_threads()}, cuda {torch.cuda.is_available()})")
    print(f"cpu            {cpu_model()} ({os.cpu_count()} logical cores)")
    print(f"cpu features   {' '.join(cpu_features()) or 'unknown'}")
    for i, adapter in enumerate(gpu_adapters()):
        print(f"{'gpu adapters' if i == 0 else '':<14} {adapter}")
    info = torchburn.cache_info()
    print(
        f"graph cache    {info['entries']}/{info['maxsize']} entries, disk {info['disk_dir'] or 'off (set TORCHBURN_CACHE_DIR)'}"
    )
    env = {k: v for k, v in os.environ.items() if k.startswith("TORCHBURN_")}
    print(f"environment    {' '.join(f'{k}={v}' for k, v in sorted(env.items())) or '(no TORCHBURN_* variables set)'}")
    print()
    return engines_cmd.run(argparse.Namespace(format="text"))


COMMAND = Command("doctor", "Check the installation: versions, CPU features, GPU adapters, plugins.", run)
