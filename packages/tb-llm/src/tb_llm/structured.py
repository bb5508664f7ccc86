"""Structured output: generation constrained to a JSON schema (or to any JSON object).

Built on llguidance (the ``structured`` extra; measured against xgrammar on SmolLM2, see
``benchmarks/bench_structured.py``). One concept: a per-sequence :class:`Constraint` with
``mask(logits)`` (forbid every token the grammar does not allow next, see :func:`apply_mask`)
and ``advance(token)`` (feed the sampled token to the grammar). ``LLM.generate(json_schema=...)``
and the server's ``response_format`` both use it, one constraint per row.

- :func:`compile_schema` turns ``True`` / ``"json_object"`` (any JSON object), a JSON-schema
  ``dict`` or its JSON text into a :class:`Schema` (checked: a bad schema is a
  :class:`StructuredOutputError`, a ``ValueError``, naming the problem).
- :func:`grammar_tokenizer` builds llguidance's view of a tb-llm :class:`Tokenizer` (HF
  ``tokenizer.json`` folders and GGUF metadata alike: both hold a ``tokenizers`` object), once
  per tokenizer and vocabulary size.
- llguidance's bitmask -> :class:`Mask` (a ``bool`` tensor and the smaller index set) is
  cached per distinct mask (JSON grammars revisit the same few masks: inside a string, after a
  key, ...).

JSON is emitted with ``", "`` and ``": "`` separators and no other whitespace (a small model
left free to emit whitespace can fill its budget with newlines); a schema may override that
with llguidance's ``"x-guidance"`` key, e.g. ``{"x-guidance": {"whitespace_flexible": true}}``.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLTokenizer

    from tb_llm.tokenizer import Tokenizer

JsonSchemaSpec = bool | str | dict[str, Any]
"""What ``json_schema=`` takes: ``True`` or ``"json_object"`` (any JSON object), a JSON schema
as a ``dict``, or its JSON text."""

ANY_OBJECT: dict[str, Any] = {"type": "object"}
_COMPILE_DEFAULTS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_MASK_CACHE_ENTRIES = 256  # distinct masks kept as torch tensors per tokenizer (~V bytes each)


class StructuredOutputError(ValueError):
    """A JSON schema that cannot be used, or a grammar that reached a dead end."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise ImportError(
            "structured output (json_schema= / response_format) needs llguidance: pip install 'tb-llm[structured]'"
        ) from None
    return llguidance


@dataclass(frozen=True)
class Schema:
    """A checked JSON schema and the llguidance grammar compiled from it (tokenizer-independent)."""

    schema: dict[str, Any]
    grammar: str

    @property
    def any_object(self) -> bool:
        return self.schema == ANY_OBJECT


def compile_schema(spec: JsonSchemaSpec) -> Schema:
    """``spec`` -> :class:`Schema`; raises :class:`StructuredOutputError` naming what is wrong."""
    if spec is True or spec == "json_object":
        schema: Any = dict(ANY_OBJECT)
    elif isinstance(spec, str):
        try:
            schema = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise StructuredOutputError(f"json_schema is not valid JSON: {exc}") from None
    elif isinstance(spec, dict):
        schema = spec
    else:
        raise StructuredOutputError(
            f"json_schema must be True, 'json_object', a JSON schema (dict) or its JSON text, got {spec!r}"
        )
    if not isinstance(schema, dict):
        raise StructuredOutputError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
    llg = _llguidance()
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=_COMPILE_DEFAULTS)
    except (ValueError, TypeError) as exc:
        raise StructuredOutputError(f"invalid JSON schema: {exc}") from None
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise StructuredOutputError(f"invalid JSON schema: {'; '.join(messages)}")
    return Schema(schema, grammar)


@dataclass(frozen=True)
class Mask:
    """One grammar state's allowed tokens, as the sampler uses them."""

    forbidden: torch.Tensor  # bool [V]: True where the token may not come next
    only_eos: bool  # the allowed tokens are end-of-sequence tokens only
    ids: np.ndarray[Any, np.dtype[np.intp]]  # the allowed ids if they are the fewer, else the forbidden ids
    ids_allowed: bool


def apply_mask(m: Mask, logits: torch.Tensor) -> torch.Tensor:
    """``logits[..., forbidden] = -inf`` in place. A contiguous CPU float32 row goes through numpy
    on the smaller of the allowed / forbidden index sets (single-threaded: torch's
    ``masked_fill_`` over a 49k row runs on the intra-op pool, which right after a native_cpu
    decode step measured ~7 ms against ~0.2 ms); anything else gets one ``masked_fill_``."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 1 and logits.is_contiguous():
        row = logits.numpy()  # a view: writes land in ``logits``
        if m.ids_allowed:
            keep = row[m.ids]
            row.fill(-np.inf)
            row[m.ids] = keep
        else:
            row[m.ids] = -np.inf
        return logits
    forbidden = m.forbidden if m.forbidden.device == logits.device else m.forbidden.to(logits.device)
    return logits.masked_fill_(forbidden, float("-inf"))


class GrammarTokenizer:
    """llguidance's tokenizer for one tb-llm tokenizer and model vocabulary, plus the cache of
    masks already converted to ``torch.bool`` ("forbidden") tensors."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        llg = _llguidance()
        hf = getattr(tokenizer, "_tok", None)
        if hf is None or not hasattr(hf, "to_str"):
            raise StructuredOutputError("structured output needs a tokenizer backed by the `tokenizers` library")
        if not eos_token_ids:
            raise StructuredOutputError("structured output needs the model's end-of-sequence token (none is known)")
        n_vocab = max(vocab_size, tokenizer.vocab_size)
        self.vocab_size = vocab_size  # the model's logits width (masks are cut to it)
        self.eos_token_ids = tuple(eos_token_ids)
        self.ll: LLTokenizer = llg.LLTokenizer(hf.to_str(), n_vocab=n_vocab, eos_token=list(self.eos_token_ids))
        self._eos = np.zeros(vocab_size, dtype=np.bool_)
        self._eos[[t for t in self.eos_token_ids if 0 <= t < vocab_size]] = True
        self._cache: dict[bytes, Mask] = {}
        self._lock = threading.Lock()

    def forbidden(self, bitmask: bytes) -> Mask:
        """llguidance bitmask (little-endian 32-bit words: token ``i`` is bit ``i % 8`` of byte
        ``i // 8``) -> the mask as tensors and index arrays (cached by the bitmask's bytes)."""
        with self._lock:
            hit = self._cache.get(bitmask)
        if hit is not None:
            return hit
        # numpy, single-threaded: on a busy machine torch's intra-op threads cost more than the work
        bits = np.unpackbits(np.frombuffer(bitmask, np.uint8), bitorder="little")[: self.vocab_size]
        forbidden = np.ones(self.vocab_size, dtype=np.bool_)  # ids past llguidance's vocabulary: never
        np.equal(bits, 0, out=forbidden[: bits.size])
        allowed_ids = np.flatnonzero(~forbidden)
        only_eos = allowed_ids.size > 0 and bool(self._eos[allowed_ids].all())
        # the smaller of the two index sets drives the numpy apply (see apply_mask)
        ids = allowed_ids if 2 * allowed_ids.size <= self.vocab_size else np.flatnonzero(forbidden)
        entry = Mask(torch.from_numpy(forbidden), only_eos, ids, ids is allowed_ids)
        with self._lock:
            if len(self._cache) >= _MASK_CACHE_ENTRIES:
                self._cache.pop(next(iter(self._cache)))  # oldest first
            self._cache[bitmask] = entry
        return entry


_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[int, GrammarTokenizer]] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


def grammar_tokenizer(tokenizer: Tokenizer | None, vocab_size: int, eos_token_ids: tuple[int, ...]) -> GrammarTokenizer:
    """The :class:`GrammarTokenizer` of ``tokenizer`` for a ``vocab_size``-wide model (built once,
    ~0.25 s for a 49k vocabulary, then cached with the tokenizer)."""
    if tokenizer is None:
        raise StructuredOutputError("structured output needs the model's tokenizer (this model has none)")
    with _TOKENIZERS_LOCK:
        per = _TOKENIZERS.setdefault(tokenizer, {})
        gt = per.get(vocab_size)
        if gt is None or gt.eos_token_ids != tuple(eos_token_ids):
            gt = per[vocab_size] = GrammarTokenizer(tokenizer, vocab_size, eos_token_ids)
        return gt


class Constraint:
    """One sequence's grammar state: ``mask(logits)`` before sampling, ``advance(token)`` after.

    ``done`` turns True once the grammar is complete and admits nothing but end-of-sequence
    (the generation stops there, with or without sampling the EOS token).
    """

    def __init__(self, tokenizer: GrammarTokenizer, schema: Schema) -> None:
        llg = _llguidance()
        self.tokenizer = tokenizer
        self.schema = schema
        self.matcher: LLMatcher = llg.LLMatcher(tokenizer.ll, schema.grammar, log_level=0)
        self._check("compiling the JSON schema")
        self._next: Mask | None = None
        self.tokens = 0

    def _check(self, doing: str) -> None:
        if self.matcher.is_error():
            raise StructuredOutputError(f"structured output: {doing} failed: {self.matcher.get_error()}")

    def _forbidden(self) -> Mask:
        if self._next is None:
            self._next = self.tokenizer.forbidden(self.matcher.compute_bitmask())
            self._check("computing the allowed tokens")
            if self._next.ids_allowed and self._next.ids.size == 0:
                raise StructuredOutputError(
                    "structured output: no token can continue the JSON (the schema admits no value, or "
                    "the text so far has no valid completion)"
                )
        return self._next

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped() or (self.matcher.is_accepting() and self._forbidden().only_eos)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Set the logits (``[V]`` or ``[B, V]``, in place) of every token the grammar forbids
        next to ``-inf`` (see :func:`apply_mask`); returns ``logits``."""
        if logits.dim() == 0 or logits.shape[-1] != self.tokenizer.vocab_size:
            raise ValueError(
                f"logits of shape {tuple(logits.shape)}: the last dimension must be the model's vocabulary "
                f"({self.tokenizer.vocab_size})"
            )
        return apply_mask(self._forbidden(), logits)

    def advance(self, token: int) -> None:
        """Feed the sampled ``token`` to the grammar (it must be one the mask allowed)."""
        self._next = None
        self.tokens += 1
        if self.matcher.is_stopped():
            return  # end-of-sequence after a complete value: nothing more to check
        if not self.matcher.consume_token(token):
            self._check(f"token {token} (step {self.tokens})")
            raise StructuredOutputError(f"structured output: token {token} is not allowed at step {self.tokens}")


@dataclass(frozen=True)
class Grammar:
    """A :class:`Schema` bound to a model's tokenizer: hands out one :class:`Constraint` per sequence."""

    tokenizer: GrammarTokenizer
    schema: Schema

    def constraint(self) -> Constraint:
        return Constraint(self.tokenizer, self.schema)


def constraint_for(
    tokenizer: Tokenizer | None, vocab_size: int, eos_token_ids: tuple[int, ...], spec: Any
) -> Constraint:
    """A fresh :class:`Constraint` for ``spec`` (a :class:`Schema` or what :func:`compile_schema` takes)."""
    schema = spec if isinstance(spec, Schema) else compile_schema(spec)
    return Constraint(grammar_tokenizer(tokenizer, vocab_size, eos_token_ids), schema)
