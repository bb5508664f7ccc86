"""What an engine offers tb-llm (kept for imports written before ``torchburn.llm``).

The descriptor and the kernel protocol now live in :mod:`torchburn.llm`.
"""

from __future__ import annotations

from torchburn.llm.descriptor import LLMBackend, llm_backends

__all__ = ["LLMBackend", "llm_backends"]
