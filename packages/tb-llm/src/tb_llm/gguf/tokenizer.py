"""The tokenizer and chat template a GGUF file carries in its metadata (``tokenizer.ggml.*``,
``tokenizer.chat_template``), built as a ``tokenizers`` Tokenizer.

GGUF stores the vocabulary, the merges, a type per token and the special ids, but not the
pre-tokenizer: ``tokenizer.ggml.pre`` names it, and llama.cpp maps that name to a split regex.
The names below get that regex; any other gets GPT-2's byte-level split.
"""

from __future__ import annotations

from typing import Any

from tb_llm.errors import CheckpointError
from tb_llm.gguf.reader import GGUFFile
from tb_llm.tokenizer import ChatTemplate, Tokenizer

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: tokenizer.ggml.pre -> how text is split before byte-level BPE
PRE_TOKENIZERS: dict[str, str] = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "smollm": "digits",  # StarCoder-style: every digit its own word, then GPT-2's split
    "starcoder": "digits",
    "refact": "digits",
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
}


def _pre_tokenizer(pre: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    rule = PRE_TOKENIZERS.get(pre, "gpt2")
    if rule == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if rule == "digits":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(rule), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_hf_tokenizer(f: GGUFFile) -> Any:
    """A ``tokenizers.Tokenizer`` for a ``gpt2`` (byte-level BPE) GGUF vocabulary."""
    from tokenizers import AddedToken, decoders, processors
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE

    model = f.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise CheckpointError(
            f.path, f"tokenizer.ggml.model {model!r} is not supported (tb-llm builds 'gpt2' byte-level BPE tokenizers)"
        )
    tokens = f.require("tokenizer.ggml.tokens")
    merges = f.get("tokenizer.ggml.merges") or []
    types = f.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f.path, "tokenizer.ggml.tokens is not a list of strings")
    if len(types) != len(tokens):
        raise CheckpointError(f.path, f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep:
            raise CheckpointError(f.path, f"tokenizer.ggml.merges entry {m!r} is not two tokens separated by a space")
        pairs.append((left, right))
    tok = HFTokenizer(BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(str(f.get("tokenizer.ggml.pre", "default")))
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == CONTROL]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == USER_DEFINED]
    tok.add_special_tokens(specials)
    if user:
        tok.add_tokens(user)
    bos, eos = _id(f, "bos"), _id(f, "eos")
    single, special_ids = "$A", []
    if f.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        single = f"{tokens[bos]} {single}"
        special_ids.append((tokens[bos], bos))
    if f.get("tokenizer.ggml.add_eos_token", False) and eos is not None:
        single = f"{single} {tokens[eos]}"
        special_ids.append((tokens[eos], eos))
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=special_ids)
    return tok


def _id(f: GGUFFile, which: str) -> int | None:
    value = f.get(f"tokenizer.ggml.{which}_token_id")
    tokens = f.get("tokenizer.ggml.tokens") or []
    if value is None:
        return None
    if not isinstance(value, int) or not 0 <= value < len(tokens):
        raise CheckpointError(f.path, f"tokenizer.ggml.{which}_token_id {value!r} is not a token id")
    return int(value)


class GGUFTokenizer(Tokenizer):
    """tb-llm's :class:`Tokenizer` built from GGUF metadata instead of a ``tokenizer.json`` folder."""

    def __init__(self, f: GGUFFile) -> None:  # the parent reads files; everything here comes from metadata
        self._tok = build_hf_tokenizer(f)
        tokens: list[str] = f.require("tokenizer.ggml.tokens")
        bos, eos, pad = _id(f, "bos"), _id(f, "eos"), _id(f, "padding")
        self.bos_token = tokens[bos] if bos is not None else None
        self.eos_token = tokens[eos] if eos is not None else None
        self.pad_token = tokens[pad] if pad is not None else None
        self.bos_token_id = bos
        eos_ids = [i for i in (eos, _id(f, "eot"), _id(f, "eom")) if i is not None]
        self.eos_token_ids = tuple(dict.fromkeys(eos_ids))
        self.pad_token_id = pad if pad is not None else (eos_ids[0] if eos_ids else 0)
        self.generation_config: dict[str, Any] = {}
        self.chat_template: ChatTemplate | None = None
        template = f.get("tokenizer.chat_template")
        if isinstance(template, str):
            self.chat_template = ChatTemplate(template, f.path, self.bos_token or "", self.eos_token or "")
