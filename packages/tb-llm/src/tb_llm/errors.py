"""Exceptions tb-llm raises. Every message names the file involved and what is wrong with it."""

from __future__ import annotations


class LLMError(Exception):
    """Base class of every tb-llm error."""


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


class BackendError(LLMError, RuntimeError):
    """No usable kernel backend for the requested device or engine."""
