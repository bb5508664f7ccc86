"""``LLM.from_pretrained`` for GGUF: find the file, read config, weights and tokenizer from it,
check the tensors against the config, build the decoder, and describe what loading did."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tb_llm.config import ModelConfig
from tb_llm.errors import CheckpointError, LLMError
from tb_llm.gguf.architecture import architecture_of, config_from_metadata, tensor_plan
from tb_llm.gguf.reader import GGUFFile
from tb_llm.gguf.tokenizer import GGUFTokenizer
from tb_llm.gguf.weights import GGUFWeights
from tb_llm.model import Decoder, expected_shapes
from tb_llm.tokenizer import Tokenizer
from torchburn.llm.protocol import LLMKernels, default_head_quant


def find_gguf(name_or_path: str | os.PathLike[str], gguf_file: str | None = None) -> Path | None:
    """The GGUF file ``name_or_path`` means, or None when it is not a GGUF checkpoint.

    A ``.gguf`` path (or any existing file: the magic check names a wrong one); a folder with
    ``gguf_file`` in it, or with exactly one ``*.gguf`` and no safetensors weights; a Hub repo id
    with ``gguf_file`` (that one file is downloaded)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        if gguf_file is not None:
            raise LLMError(f"{path}: gguf_file={gguf_file!r} names a file inside a folder, but this is a file")
        return path
    if path.is_dir():
        if gguf_file is not None:
            chosen = path / gguf_file
            if not chosen.is_file():
                raise CheckpointError(chosen, "file not found (named by gguf_file=)")
            return chosen
        found = sorted(path.glob("*.gguf"))
        if not found or any(path.glob("*.safetensors")):
            return None
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise LLMError(f"{path}: holds {len(found)} GGUF files ({names}); choose one with gguf_file=")
        return found[0]
    if str(name_or_path).endswith(".gguf") and not path.exists():
        raise CheckpointError(path, "file not found")
    if gguf_file is not None:
        return _download(str(name_or_path), gguf_file)
    return None


def _download(repo_id: str, filename: str) -> Path:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # pragma: no cover - declared dependency
        raise LLMError("loading from the Hub needs huggingface_hub: pip install huggingface_hub") from exc
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename))
    except Exception as exc:
        raise LLMError(
            f"{repo_id}: could not get {filename} from the Hugging Face Hub: {type(exc).__name__}: {exc}"
        ) from exc


@dataclass
class GGUFLoad:
    """What ``load_gguf`` built, and what it did to each GGML tensor type."""

    path: Path
    config: ModelConfig
    model: Decoder
    tokenizer: Tokenizer | None
    architecture: str
    tensor_types: dict[str, int]  # GGML type -> tensors of that type the model uses
    loaded_as: dict[str, dict[str, int]]  # GGML type -> {kept|dequantized|requantized|converted|quantized: count}
    notes: list[str] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        return {
            "format": "gguf",
            "file": str(self.path),
            "architecture": self.architecture,
            "tensor_types": dict(self.tensor_types),
            "loaded_as": {k: dict(v) for k, v in self.loaded_as.items()},
            "notes": list(self.notes),
        }


def check_tensors(f: GGUFFile, cfg: ModelConfig, weights: GGUFWeights) -> None:
    """Every tensor the config implies is in the file with the implied shape."""
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            raise CheckpointError(
                f.path, f"the metadata implies tensor {name!r} {list(shape)}, but the file has no such tensor"
            )
        got = weights.shape_of(name)
        if got != shape:
            g = weights.plan[name].gguf_name
            raise CheckpointError(
                f.path,
                f"tensor {g!r} ({weights.type_of(name)}, read as {name!r}) has shape {list(got)}, "
                f"but the metadata implies {list(shape)}",
            )
    for name, p in weights.plan.items():
        if p.unpermute_heads and weights.shape_of(name)[0] % (2 * p.unpermute_heads):
            raise CheckpointError(
                f.path, f"tensor {p.gguf_name!r} rows do not split into {p.unpermute_heads} RoPE heads"
            )


def load_gguf(
    path: Path,
    backend: LLMKernels | Callable[[ModelConfig], LLMKernels],
    quant: str,
    group_size: int = 32,
    progress: Callable[[int], None] | None = None,
) -> GGUFLoad:
    """``backend``: the kernel backend, or a function of the file's config that returns it
    (``device="auto"`` measures on the model's shape before any weight is read)."""
    f = GGUFFile(path)
    arch, _ = architecture_of(f)
    cfg = config_from_metadata(f)
    if not hasattr(backend, "linear"):
        backend = backend(cfg)  # type: ignore[operator]
    weights = GGUFWeights(f, tensor_plan(f, cfg))
    check_tensors(f, cfg, weights)
    notes: list[str] = []
    tokenizer: Tokenizer | None = None
    if "tokenizer.ggml.model" in f.metadata:
        try:
            tokenizer = GGUFTokenizer(f)
        except CheckpointError as exc:
            if "is not supported" not in exc.problem:
                raise
            notes.append(f"no tokenizer: {exc.problem}; prompts must be token ids")
            warnings.warn(f"{path}: {exc.problem}; prompts must be token ids", stacklevel=3)
    # The decoder reads the file's blocks through GGUFWeights, which looks like CheckpointWeights
    # to it (get / in / quantized).
    model = Decoder(cfg, weights, backend, quant, group_size, progress=progress)  # type: ignore[arg-type]
    head_quant = backend.head_quant(quant) if hasattr(backend, "head_quant") else default_head_quant(quant)
    small = "bf16" if model.dtype.is_floating_point and model.dtype.itemsize == 2 else "fp32"
    targets: dict[str, str] = {}
    linear = {n for n in expected_shapes(cfg) if n.endswith("_proj.weight")}
    for name in expected_shapes(cfg):
        if name in linear:
            targets[name] = quant
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            targets[name] = head_quant
        else:
            gemma_norm = cfg.family.norm_offset and name.endswith("norm.weight")
            targets[name] = "fp32" if gemma_norm else small
    types: dict[str, int] = {}
    for name in targets:
        types[weights.type_of(name)] = types.get(weights.type_of(name), 0) + 1
    return GGUFLoad(path, cfg, model, tokenizer, arch, dict(sorted(types.items())), weights.summary(targets), notes)
