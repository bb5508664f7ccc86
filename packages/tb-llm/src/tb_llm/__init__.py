"""tb-llm: Hugging Face decoder checkpoints on TorchBurn engines, with a PyTorch reference path.

from tb_llm import LLM
llm = LLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct", quant="int4")
print(llm.generate("The capital of France is", max_new_tokens=16))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tb_llm._version import __version__

if TYPE_CHECKING:
    from tb_llm.errors import BackendError, ChatTemplateError, CheckpointError, LLMError, UnsupportedModelError
    from tb_llm.llm import LLM, ChatSession, Generation, TextDelta, Timing
    from tb_llm.logprobs import TokenLogprob
    from tb_llm.perplexity import Score

__all__ = [
    "LLM",
    "BackendError",
    "ChatSession",
    "ChatTemplateError",
    "CheckpointError",
    "Generation",
    "LLMError",
    "Score",
    "TextDelta",
    "Timing",
    "TokenLogprob",
    "UnsupportedModelError",
    "__version__",
]

# Importing these pulls in torch (seconds); `python -m tb_llm --help` must answer without it, so
# the public names load on first use.
_LAZY = {
    "LLM": "tb_llm.llm",
    "ChatSession": "tb_llm.llm",
    "Generation": "tb_llm.llm",
    "Timing": "tb_llm.llm",
    "TextDelta": "tb_llm.llm",
    "TokenLogprob": "tb_llm.logprobs",
    "Score": "tb_llm.perplexity",
    "BackendError": "tb_llm.errors",
    "ChatTemplateError": "tb_llm.errors",
    "CheckpointError": "tb_llm.errors",
    "LLMError": "tb_llm.errors",
    "UnsupportedModelError": "tb_llm.errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tb_llm' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
