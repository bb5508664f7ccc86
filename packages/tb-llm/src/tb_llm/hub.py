"""Where a checkpoint comes from: a local folder, or a Hub repo id through ``huggingface_hub``."""

from __future__ import annotations

import os
from pathlib import Path

from tb_llm.errors import LLMError

# Only what tb-llm reads: never *.bin / *.pt (pickles), never the original/ or onnx/ sub-folders.
ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
]
IGNORE_PATTERNS = ["*/*"]


def looks_local(name: str) -> bool:
    """Whether a name that exists nowhere on disk was meant as a local path, not a Hub repo id.

    A Hub id is ``name`` or ``org/name``. Anything that starts with ``./``, ``../``, ``/`` or
    ``~``, holds more than one ``/`` or an OS path separator other than ``/``, or whose first
    component is an existing local folder (``models/qwen`` with a ``models/`` here) is a path.
    """
    if name in (".", "..") or name.startswith(("./", "../", "/", "~", ".\\", "..\\")):
        return True
    separators = {s for s in (os.sep, os.altsep) if s and s != "/"}
    if name.count("/") > 1 or any(s in name for s in separators):
        return True
    head, sep, _ = name.partition("/")
    return bool(sep) and Path(head).expanduser().is_dir()


def resolve(name_or_path: str | os.PathLike[str], revision: str | None = None, token: str | bool | None = None) -> Path:
    """A local folder holding the checkpoint files (downloading them first if needed).

    ``token``: the argument, else ``HF_TOKEN``, else the token saved by ``hf auth login``
    (``huggingface_hub.get_token`` looks in both). ``HF_HUB_OFFLINE=1`` serves from the local
    HF cache (``HF_HUB_CACHE`` / ``HF_HOME``) without touching the network.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    name = str(name_or_path)
    if path.exists():
        raise LLMError(f"{name}: not a folder (a checkpoint is a folder with config.json, or a .gguf file)")
    if not isinstance(name_or_path, str) or looks_local(name):  # a Path object always means a local one
        raise LLMError(
            f"{name}: not a folder: no such local folder {path.absolute()} (a path, so not looked up on the Hub)"
        )
    try:
        import huggingface_hub
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - declared dependency
        raise LLMError("loading from the Hub needs huggingface_hub: pip install huggingface_hub") from exc
    if token is None:
        token = huggingface_hub.get_token()
    try:
        folder = snapshot_download(
            repo_id=name,
            revision=revision,
            token=token,
            allow_patterns=ALLOW_PATTERNS,
            ignore_patterns=IGNORE_PATTERNS,
        )
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        hint = (
            " (HF_HUB_OFFLINE is set: the repo must already be in the local HF cache"
            f" {os.environ.get('HF_HUB_CACHE') or os.environ.get('HF_HOME') or '~/.cache/huggingface'})"
            if offline
            else " (check the repo id, the revision, your network, and HF_TOKEN for gated repos)"
        )
        hint += f"; nor is it a local folder: no {path.absolute()}"
        raise LLMError(
            f"{name}: could not get the checkpoint from the Hugging Face Hub: {type(exc).__name__}: {exc}{hint}"
        ) from exc
    return Path(folder)
