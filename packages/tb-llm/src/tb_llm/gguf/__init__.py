"""GGUF checkpoints (llama.cpp's format): ``LLM.from_pretrained("model.gguf")``.

``reader`` opens and validates the file (with the ``gguf`` package), ``architecture`` maps its
metadata and tensor names onto tb-llm's config, ``dequantize`` decodes GGML blocks, ``weights``
decides per tensor whether blocks are kept, dequantized or requantized, ``tokenizer`` builds the
tokenizer and chat template from the metadata, ``loader`` puts them together.
"""

from __future__ import annotations

from tb_llm.gguf.dequantize import SUPPORTED_TYPES, dequantize
from tb_llm.gguf.loader import GGUFLoad, find_gguf, load_gguf
from tb_llm.gguf.reader import GGUFFile, GGUFTensor

__all__ = ["SUPPORTED_TYPES", "GGUFFile", "GGUFLoad", "GGUFTensor", "dequantize", "find_gguf", "load_gguf"]
