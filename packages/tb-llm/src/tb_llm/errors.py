"""Exceptions tb-llm raises. Every message names the file involved and what is wrong with it.

``LLMError`` and ``BackendError`` are tb-core's (``torchburn.llm.errors``), so an engine backend
raises the class a tb-llm user catches without importing tb-llm.
"""

from __future__ import annotations

from torchburn.llm.errors import BackendError, LLMError

__all__ = ["BackendError", "ChatTemplateError", "CheckpointError", "LLMError", "UnsupportedModelError"]


class CheckpointError(LLMError, ValueError):
    """A checkpoint file is missing, corrupt, or does not match the model config."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnsupportedModelError(LLMError, ValueError):
    """The config names an architecture or feature tb-llm does not implement."""


class ChatTemplateError(LLMError, ValueError):
    """The chat template cannot be parsed or rendered."""
