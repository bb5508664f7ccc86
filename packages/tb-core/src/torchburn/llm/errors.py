"""Errors of the LLM kernel-backend contract, shared by tb-llm and every engine backend.

tb-llm re-exports both (``tb_llm.LLMError``, ``tb_llm.BackendError``): an engine raises the same
class a user of tb-llm catches, without importing tb-llm.
"""

from __future__ import annotations


class LLMError(Exception):
    """Base class of every error of the LLM path (tb-llm's own errors derive from it too)."""


class BackendError(LLMError, RuntimeError):
    """No usable kernel backend for the requested device or engine, or a backend broke its contract."""


class ProtocolVersionError(BackendError):
    """A backend implements another version of the kernel protocol than the tb-llm loading it."""
