"""What a server instance serves and the limits it enforces."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class ServeSettings:
    model_name: str
    """The id clients send as ``model`` and ``/v1/models`` lists."""
    aliases: tuple[str, ...] = ()
    """Other ids accepted for the same model (e.g. the path it was loaded from)."""
    api_key: str | None = None
    """When set, every ``/v1`` request needs ``Authorization: Bearer <api_key>``."""
    max_batch: int = 16
    """Sequences decoded together in one step."""
    max_queue: int = 256
    """Requests allowed to wait for a row; beyond it, 429."""
    max_body_bytes: int = 1 << 20
    """Largest accepted request body; beyond it, 413."""
    max_model_len: int | None = None
    """Prompt + completion tokens per request (default: the model's ``max_position_embeddings``)."""
    default_max_tokens: int = 16
    """``max_tokens`` of a ``/v1/completions`` request that sets none (OpenAI's default)."""
    max_stop: int = 16
    """Most stop strings per request."""
    max_n: int = 16
    """Most choices (``n``) per request; each takes a batch row."""
    prefix_cache_mb: float = 512.0
    """Memory for the prefix cache (keys and values of recent prompts and chat turns, reused by
    requests that start with the same tokens), in MiB; 0 turns it off."""
    prefix_block_tokens: int = 32
    """Tokens per prefix-cache block: a prefix is reused in whole blocks."""
    drain_timeout: float = 30.0
    """On SIGTERM, seconds the server lets running requests finish before it ends them."""
    speculative: str | None = None
    """``"ngram"``: prompt-lookup speculative decoding for requests that do not set ``speculative``
    themselves; None: only for those that ask."""
    draft_tokens: int = 4
    """Tokens drafted per step when speculating (a request's ``num_tokens`` overrides it)."""

    @staticmethod
    def api_key_from_env(value: str | None) -> str | None:
        """``--api-key`` wins; else ``TORCHBURN_API_KEY``; an empty string means no key."""
        key = value if value is not None else os.environ.get("TORCHBURN_API_KEY")
        return key or None
