"""``device="auto"``: which installed backend runs this model fastest, decided by measurement.

The candidates are every engine LLM backend tb-core's plugins offer (CPU ones, and GPU ones such as
tb-wgpu's, which take host tensors), tb-llm's PyTorch reference on the CPU, and PyTorch's own
GPU (CUDA / ROCm / MPS) when it sees one. Each is probed with a few decode steps of a model of the
checkpoint's shape: its hidden and intermediate sizes, heads, architecture and quantization, with
random weights, a few of its layers (about :data:`PROBE_PARAMS` weights, at most
:data:`PROBE_MAX_LAYERS`) and a vocabulary capped at :data:`PROBE_VOCAB`. A decode step streams
every weight once, so the median time per probe step, times the full model's linear weights over
the probe's, estimates the full model's time per token.

The lowest estimate wins, but the backend tb-llm would take without measuring (the
highest-priority CPU backend that loads, else the reference) keeps the choice unless another one is
at least :data:`MARGIN` faster: two close figures on a noisy machine must not flip the choice from
one run to the next.

The figures and the choice are kept in ``<user cache dir>/llm-device/<key>.json`` (tb-core's
``TORCHBURN_CACHE_DIR``; ``0`` / ``off``: nothing kept, a probe on every load). The key holds the
machine (host name, CPU model, CPU count, torch threads, torch version), the checkpoint's shape,
the quant and group size, and every candidate's name and version (package version and source
fingerprint, so an upgraded or rebuilt engine is measured again); when one of them changes, the
key changes and the next load measures again. A load whose key is cached loads only the chosen
backend. ``LLM.info()["device_choice"]`` shows the figures and the choice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from tb_llm.config import ModelConfig
from tb_llm.errors import BackendError
from tb_llm.model import Decoder, expected_shapes
from tb_llm.reference_backend import ReferenceBackend
from torchburn.llm.protocol import LLMKernels

__all__ = ["Candidate", "auto_select", "candidates", "probe"]

log = logging.getLogger("tb_llm")

#: Linear weights the probe model aims at (it takes as many whole layers as fit, at least one).
PROBE_PARAMS = 32_000_000
PROBE_MAX_LAYERS = 4
#: Rows of the probe's output head (its cost is scaled like the layers').
PROBE_VOCAB = 4096
#: Untimed steps first (a compiled step builds its program on the first call), then timed steps
#: until MAX_STEPS or STEP_BUDGET_S, whichever comes first (at least MIN_STEPS).
WARMUP_STEPS = 2
MIN_STEPS = 3
MAX_STEPS = 12
STEP_BUDGET_S = 0.3
#: Another backend replaces the default only when its estimate is this much lower.
MARGIN = 0.15
#: Bumped when the probe measures something else: older cached figures are then not reused.
PROBE_VERSION = 1


@dataclass
class Candidate:
    """A backend ``device="auto"`` may choose. ``load`` builds it (a :class:`BackendError` when it
    cannot run here, e.g. no GPU adapter); ``version`` changes when its code does."""

    name: str
    engine: str
    kind: str  # "cpu" or "gpu"
    version: str
    load: Callable[[], LLMKernels]
    default: bool = False  # what tb-llm takes without measuring


def _descriptors() -> list[Any]:
    from tb_llm.backends import _other_plugins_installed

    if not _other_plugins_installed():
        return []
    try:
        from torchburn.llm_backend import llm_backends

        return list(llm_backends())
    except Exception as exc:  # a broken plugin never stops the reference path
        log.debug("listing LLM backends failed: %s", exc)
        return []


def _version(module: str) -> str:
    from torchburn.cache import source_fingerprint

    package = module.split(".")[0]
    try:
        dist = metadata.packages_distributions().get(package, [package])[0]
        release = metadata.version(dist)
    except (metadata.PackageNotFoundError, IndexError):
        release = "?"
    return f"{release}@{source_fingerprint(package)}"


def candidates() -> list[Candidate]:
    """Every backend this machine offers, the default (see the module) marked."""
    from tb_llm.backends import _gpu_device, _load

    cpu = torch.device("cpu")
    out: list[Candidate] = []
    for desc in _descriptors():
        kind = "gpu" if desc.device == "gpu" else "cpu"
        out.append(
            Candidate(
                desc.name,
                desc.engine,
                kind,
                _version(getattr(desc.load, "__module__", None) or desc.engine),
                functools.partial(_load, desc, cpu, strict=True),
            )
        )
    reference_version = _version("tb_llm") + f"/torch {torch.__version__}"
    out.append(Candidate("reference", "reference", "cpu", reference_version, lambda: ReferenceBackend(cpu)))
    gpu = _gpu_device()
    if gpu is not None:
        out.append(Candidate(f"torch-{gpu.type}", "reference", "gpu", reference_version, lambda: ReferenceBackend(gpu)))
    for c in out:  # the static choice: the first CPU backend (priority order), the reference last
        if c.kind == "cpu":
            c.default = True
            break
    return out


# -- the probe --------------------------------------------------------------------------------
def linear_params(cfg: ModelConfig) -> int:
    """Weights one decode step streams: every projection of every layer, and the output head."""
    shapes = expected_shapes(cfg)
    total = cfg.vocab_size * cfg.hidden_size
    for name, shape in shapes.items():
        if name.endswith("_proj.weight"):
            total += shape[0] * shape[1]
    return total


def probe_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with fewer layers (about PROBE_PARAMS weights) and a capped vocabulary."""
    one = replace(cfg, num_layers=1, sliding_layers=cfg.sliding_layers[:1], vocab_size=min(cfg.vocab_size, 8))
    per_layer = max(1, linear_params(one) - one.vocab_size * one.hidden_size)
    layers = max(1, min(cfg.num_layers, PROBE_MAX_LAYERS, PROBE_PARAMS // per_layer))
    return replace(
        cfg,
        num_layers=layers,
        sliding_layers=cfg.sliding_layers[:layers],
        vocab_size=min(cfg.vocab_size, PROBE_VOCAB),
        bos_token_id=None,
        eos_token_ids=(),
        pad_token_id=None,
    )


class _RandomWeights:
    """What ``Decoder`` reads (``get``, ``in``), random: norms near 1, matrices small."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.shapes = expected_shapes(cfg)
        self.gen = torch.Generator().manual_seed(0)

    def __contains__(self, name: str) -> bool:
        return name in self.shapes

    def get(self, name: str) -> torch.Tensor:
        t = torch.empty(self.shapes[name])
        if name.endswith("norm.weight"):
            return t.fill_(1.0)
        return t.uniform_(-0.05, 0.05, generator=self.gen)


def probe(backend: LLMKernels, cfg: ModelConfig, quant: str, group_size: int) -> dict[str, Any]:
    """Time decode steps of the probe model of ``cfg`` on ``backend``; the figures as a dict."""
    start = time.perf_counter()
    pcfg = probe_config(cfg)
    model = Decoder(pcfg, _RandomWeights(pcfg), backend, quant, group_size)  # type: ignore[arg-type]
    built = time.perf_counter() - start
    dev = model.device
    cache = model.new_cache(1, WARMUP_STEPS + MAX_STEPS + 1)
    token = torch.ones(1, 1, dtype=torch.long, device=dev)

    def step(at: int) -> None:
        pos = torch.full((1, 1), at, dtype=torch.long, device=dev)
        model.forward(token, pos, cache).float().cpu()  # to the host, as generation reads them

    for i in range(WARMUP_STEPS):
        step(i)
    times: list[float] = []
    timed = time.perf_counter()
    for i in range(WARMUP_STEPS, WARMUP_STEPS + MAX_STEPS):
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
        if len(times) >= MIN_STEPS and time.perf_counter() - timed > STEP_BUDGET_S:
            break
    per_step = statistics.median(times)
    scale = linear_params(cfg) / linear_params(pcfg)
    return {
        "ms_per_token": round(1e3 * per_step * scale, 4),
        "probe_ms_per_step": round(1e3 * per_step, 4),
        "steps": len(times),
        "build_s": round(built, 3),
        "seconds": round(time.perf_counter() - start, 3),
    }


# -- the cache ---------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def cache_key(cfg: ModelConfig, quant: str, group_size: int, cands: list[Candidate]) -> dict[str, Any]:
    """Everything the measured choice depends on."""
    return {
        "probe_version": PROBE_VERSION,
        "machine": {
            "node": platform.node(),
            "system": platform.system(),
            "arch": platform.machine(),
            "cpu": _cpu_model(),
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "shape": {
            "model_type": cfg.model_type,
            "hidden": cfg.hidden_size,
            "intermediate": cfg.intermediate_size,
            "layers": cfg.num_layers,
            "heads": cfg.num_heads,
            "kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
            "vocab": cfg.vocab_size,
            "tied": cfg.tie_word_embeddings,
        },
        "quant": quant,
        "group_size": group_size if quant == "int4" else None,
        "backends": [[c.name, c.engine, c.kind, c.version] for c in cands],
    }


def _cache_file(key: dict[str, Any]) -> Path | None:
    from torchburn.cache import user_cache_dir

    root = user_cache_dir()
    if root is None:
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return root / "llm-device" / f"{digest}.json"


def _read(path: Path | None, key: dict[str, Any]) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # unreadable or half written: measure again
    if not isinstance(stored, dict) or stored.get("key") != key or not isinstance(stored.get("choice"), dict):
        return None
    choice: dict[str, Any] = stored["choice"]
    return choice


def _write(path: Path | None, key: dict[str, Any], choice: dict[str, Any]) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "choice": choice}, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)  # readers see the old file or the whole new one
    except OSError as exc:  # a read-only cache folder costs a probe per load, nothing else
        log.debug("could not keep the device choice in %s: %s", path, exc)


# -- the choice --------------------------------------------------------------------------------
def decide(figures: dict[str, dict[str, Any]], default: str) -> tuple[str, str]:
    """The backend to use and why, from each candidate's figures (``ms_per_token`` or ``error``)."""
    timed = {n: f["ms_per_token"] for n, f in figures.items() if "ms_per_token" in f}
    if not timed:
        raise BackendError(
            "device='auto': no backend could run the probe: "
            + "; ".join(f"{n}: {f.get('error')}" for n, f in figures.items())
        )
    best = min(timed, key=lambda n: timed[n])
    if default in timed and best != default:
        if timed[best] > (1.0 - MARGIN) * timed[default]:
            return default, (
                f"{best} measured {timed[best]:.3g} ms/token, within {MARGIN:.0%} of the default {default}'s "
                f"{timed[default]:.3g}: the default stays"
            )
        return best, f"{best} measured {timed[best]:.3g} ms/token against the default {default}'s {timed[default]:.3g}"
    if best == default:
        return best, f"{best} (the default) measured fastest, {timed[best]:.3g} ms/token"
    return best, f"{best} measured fastest, {timed[best]:.3g} ms/token (the default {default} could not run)"


def auto_select(cfg: ModelConfig, quant: str, group_size: int) -> tuple[LLMKernels, dict[str, Any]]:
    """The backend ``device="auto"`` runs ``cfg`` on, and the record of the choice for ``info()``."""
    cands = candidates()
    default = next((c.name for c in cands if c.default), cands[0].name)
    if len(cands) == 1:
        return cands[0].load(), {"chosen": cands[0].name, "how": "only candidate", "candidates": {}}
    key = cache_key(cfg, quant, group_size, cands)
    path = _cache_file(key)
    by_name = {c.name: c for c in cands}
    cached = _read(path, key)
    if cached is not None and cached.get("chosen") in by_name:
        try:
            backend = by_name[cached["chosen"]].load()
            return backend, {**cached, "how": "cached", "cache_file": str(path)}
        except BackendError as exc:  # it ran when measured but not now: measure again
            log.info("device='auto': cached choice %s no longer loads (%s); probing again", cached["chosen"], exc)
    start = time.perf_counter()
    figures: dict[str, dict[str, Any]] = {}
    loaded: dict[str, LLMKernels] = {}
    for c in cands:
        try:
            backend = c.load()
            figures[c.name] = {"kind": c.kind, **probe(backend, cfg, quant, group_size)}
            loaded[c.name] = backend
        except Exception as exc:  # a candidate that cannot run here is reported, not fatal
            figures[c.name] = {"kind": c.kind, "error": f"{type(exc).__name__}: {exc}"}
    chosen, why = decide(figures, default)
    pcfg = probe_config(cfg)
    choice = {
        "chosen": chosen,
        "default": default,
        "why": why,
        "candidates": figures,
        "probe": {
            "layers": pcfg.num_layers,
            "vocab": pcfg.vocab_size,
            "scale": round(linear_params(cfg) / linear_params(pcfg), 3),
            "seconds": round(time.perf_counter() - start, 3),
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write(path, key, choice)
    return loaded[chosen], {**choice, "how": "measured", "cache_file": str(path) if path is not None else None}
