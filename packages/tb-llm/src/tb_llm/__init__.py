"""tb-llm: Hugging Face decoder checkpoints on TorchBurn engines, with a PyTorch reference path.

from tb_llm import LLM
llm = LLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct", quant="int4")
print(llm.generate("The capital of France is", max_new_tokens=16).text)
"""

from __future__ import annotations

from tb_llm._version import __version__
from tb_llm.errors import BackendError, ChatTemplateError, CheckpointError, LLMError, UnsupportedModelError
from tb_llm.llm import LLM, ChatSession, Generation, Timing

__all__ = [
    "LLM",
    "BackendError",
    "ChatSession",
    "ChatTemplateError",
    "CheckpointError",
    "Generation",
    "LLMError",
    "Timing",
    "UnsupportedModelError",
    "__version__",
]
