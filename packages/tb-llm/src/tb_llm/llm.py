"""``LLM``: load a checkpoint, then ``generate`` / ``stream`` / ``chat``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tb_llm.backends import LLMKernels, resolve_device, select_backend
from tb_llm.config import ModelConfig, load_config
from tb_llm.hub import resolve
from tb_llm.logprobs import TokenLogprob, TokenPieces, check_top, log_softmax, token_logprob
from tb_llm.model import Decoder, check_weights
from tb_llm.perplexity import Score, score_tokens
from tb_llm.quant import QUANTS
from tb_llm.safetensors_io import CheckpointWeights
from tb_llm.sampling import SamplingParams, apply_repetition_penalty, sample
from tb_llm.serve.prefix_cache import PrefixCache
from tb_llm.speculative import Speculative, parse_speculative
from tb_llm.speculative import run as speculative_run
from tb_llm.tokenizer import IncrementalDecoder, Tokenizer
from torchburn.llm.kv_cache import zeros

if TYPE_CHECKING:
    from tb_llm.structured import Constraint, JsonSchemaSpec, Schema

Message = dict[str, Any]
Prompt = str | list[Message] | list[int]


@dataclass
class Timing:
    load_seconds: float = 0.0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    draft_tokens: int = 0  # speculative decoding: tokens drafted, and how many the model accepted
    accepted_tokens: int = 0

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.decode_seconds / self.decode_tokens if self.decode_tokens else 0.0


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str  # "stop": EOS or a stop string; "length": max_new_tokens reached
    timing: Timing = field(default_factory=Timing)
    logprobs: list[TokenLogprob] | None = None
    """With ``logprobs=k``: one entry per generated token (``token_ids`` order), each with its
    ``k`` most likely alternatives."""

    def __str__(self) -> str:
        # `print(llm.generate(...))` shows the completion; repr() keeps every field.
        return self.text


class TextDelta(str):
    """A piece of streamed text; with ``stream(..., logprobs=k)`` it also carries the entries of
    the tokens generated since the previous delta (a delta may be ``""`` when the text of its
    tokens is held back: half a character, or what may start a stop string)."""

    logprobs: tuple[TokenLogprob, ...] = ()

    def __new__(cls, text: str, logprobs: Sequence[TokenLogprob] = ()) -> TextDelta:
        out = super().__new__(cls, text)
        out.logprobs = tuple(logprobs)
        return out


class _Seq:
    def __init__(
        self, llm: LLM, prompt_ids: list[int], stop: Sequence[str], constraint: Constraint | None = None
    ) -> None:
        self.prompt_ids = prompt_ids
        self.constraint = constraint  # structured output: the grammar this sequence must follow
        self.ids: list[int] = []
        self.decoder = IncrementalDecoder(llm.tokenizer) if llm.tokenizer is not None else None
        self.text = ""
        self.emitted = 0
        self.stop = list(stop)
        self.finish_reason: str | None = None
        self.logprobs: list[TokenLogprob] = []
        self.logprobs_emitted = 0

    def take_logprobs(self) -> list[TokenLogprob]:
        out = self.logprobs[self.logprobs_emitted :]
        self.logprobs_emitted = len(self.logprobs)
        return out

    def add(self, token: int, eos: bool) -> None:
        self.ids.append(token)
        if eos:
            self.finish_reason = "stop"
            return
        if self.decoder is not None:
            self.text += self.decoder.push(token)
            for s in self.stop:
                at = self.text.find(s)
                if at >= 0:
                    self.text = self.text[:at]
                    self.finish_reason = "stop"

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            if self.decoder is not None:
                self.text += self.decoder.flush()
            self.finish_reason = reason

    def take_delta(self) -> str:
        """Text that can be shown now: all of it once finished, else all but what could still
        turn out to be the start of a stop string."""
        end = len(self.text)
        if self.finish_reason is None:
            for s in self.stop:
                for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:n]):
                        end = min(end, len(self.text) - n)
                        break
        delta = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return delta


class LLM:
    """A decoder-only language model ready to generate. Create it with :meth:`from_pretrained`."""

    def __init__(
        self,
        model: Decoder,
        tokenizer: Tokenizer | None,
        path: Path,
        quant: str,
        load_seconds: float,
        load_info: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.path = path
        self.quant = quant
        self.load_seconds = load_seconds
        self.load_info: dict[str, Any] = load_info or {"format": "safetensors"}
        self.prefix_cache: PrefixCache | None = None  # see enable_prefix_cache

    # -- loading --------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        quant: str = "fp32",
        device: str = "auto",
        engine: str | None = None,
        revision: str | None = None,
        token: str | bool | None = None,
        group_size: int = 32,
        progress: bool | None = None,
        gguf_file: str | None = None,
        prefix_cache_mb: float = 0.0,
    ) -> LLM:
        """Load a Hugging Face decoder checkpoint.

        ``name_or_path``: a folder with ``config.json``, safetensors weights (single file or
        sharded with ``model.safetensors.index.json``) and ``tokenizer.json``; or a Hub repo id;
        or a GGUF file, a folder holding one, or ``gguf_file=`` naming one in a folder or Hub repo
        (see :mod:`tb_llm.gguf`).
        ``quant``: ``fp32``, ``bf16``, ``int8`` (per output channel) or ``int4`` (group-wise,
        ``group_size`` 32/64/128). ``device``: ``auto`` (measured probe), ``cpu`` or ``gpu``.
        ``engine``: an installed TorchBurn engine whose LLM backend to use; ``None`` picks the
        best installed one, falling back to the PyTorch reference.
        ``prefix_cache_mb``: memory for a prefix cache (see :meth:`enable_prefix_cache`); 0: none.
        """
        llm = cls._load(name_or_path, quant, device, engine, revision, token, group_size, progress, gguf_file)
        if prefix_cache_mb:
            llm.enable_prefix_cache(prefix_cache_mb)
        return llm

    @classmethod
    def _load(
        cls,
        name_or_path: str | os.PathLike[str],
        quant: str,
        device: str,
        engine: str | None,
        revision: str | None,
        token: str | bool | None,
        group_size: int,
        progress: bool | None,
        gguf_file: str | None,
    ) -> LLM:
        if quant not in QUANTS:
            raise ValueError(f"quant must be one of {', '.join(QUANTS)}, got {quant!r}")
        start = time.perf_counter()
        from tb_llm.gguf.loader import find_gguf

        gguf_path = find_gguf(name_or_path, gguf_file)
        if gguf_path is not None:
            return cls._from_gguf(gguf_path, quant, device, engine, group_size, progress, start)
        folder = resolve(name_or_path, revision=revision, token=token)
        cfg = load_config(folder / "config.json")
        weights = CheckpointWeights(folder)
        check_weights(cfg, weights, str(folder / "config.json"))
        tokenizer = Tokenizer(folder, cfg.raw) if (folder / "tokenizer.json").is_file() else None
        backend, chosen = _choose_backend(device, engine, cfg, quant, group_size)
        bar = _progress_bar(Decoder.linear_count(cfg), f"loading {quant}", progress)
        try:
            model = Decoder(cfg, weights, backend, quant, group_size, progress=bar.update if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        return cls(model, tokenizer, folder, quant, time.perf_counter() - start, {"format": "safetensors", **chosen})

    @classmethod
    def _from_gguf(
        cls,
        path: Path,
        quant: str,
        device: str,
        engine: str | None,
        group_size: int,
        progress: bool | None,
        start: float,
    ) -> LLM:
        from tb_llm.gguf.loader import load_gguf

        chosen: dict[str, Any] = {}

        def choose(cfg: ModelConfig) -> LLMKernels:  # the config is read from the file first
            backend, record = _choose_backend(device, engine, cfg, quant, group_size)
            chosen.update(record)
            return backend

        bar = _progress_bar(0, f"loading {path.name} as {quant}", progress)  # tensor count unknown until read
        try:
            loaded = load_gguf(path, choose, quant, group_size, progress=bar.update if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        info = {**loaded.info(), **chosen}
        return cls(loaded.model, loaded.tokenizer, path, quant, time.perf_counter() - start, info)

    def info(self) -> dict[str, Any]:
        """How this model was loaded: checkpoint format, quant, engine, device; for a GGUF file
        also the GGML tensor types and, per type, whether its tensors were ``kept``,
        ``dequantized``, ``requantized``, ``converted`` (float to float) or ``quantized``. With a
        prefix cache, its state and counters under ``prefix_cache``. Loaded with ``device="auto"``
        (and no ``engine``): ``device_choice``, the backend chosen, how (``measured``, ``cached``
        or ``only candidate``), why, and each candidate's probe figures (``ms_per_token``, the
        estimate for this model) or the ``error`` that kept it out (see :mod:`tb_llm.auto_device`)."""
        out = {
            "path": str(self.path),
            "quant": self.quant,
            "engine": self.engine,
            "device": str(self.model.device),
            "load_seconds": self.load_seconds,
            **self.load_info,
        }
        if self.prefix_cache is not None:
            out["prefix_cache"] = self.prefix_cache.stats()
        return out

    def enable_prefix_cache(self, mb: float, block_tokens: int = 32) -> None:
        """Keep the keys and values of recent single-prompt ``generate`` / ``stream`` calls (prompt
        and completion) in blocks of ``block_tokens``, up to ``mb`` MiB (least recently used go
        first; 0 turns it off), so a later call that starts with the same tokens (a repeated system
        prompt) prefills only the rest. Batches, ``n > 1`` and chat sessions (which keep their own
        cache) do not use it. Raises ``ValueError`` for a model whose RoPE frequencies depend on
        the sequence length (dynamic, LongRoPE): their keys cannot be reused."""
        from tb_llm.serve.prefix_cache import PrefixCache, reuse_blocker

        if mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 turns the prefix cache off), got {mb}")
        blocker = reuse_blocker(self.config.rope.rope_type)
        if mb and blocker is not None:
            raise ValueError(f"no prefix cache for this model: {blocker}")
        self.prefix_cache = PrefixCache(int(mb * (1 << 20)), block_tokens) if mb else None

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    @property
    def backend(self) -> LLMKernels:
        return self.model.backend

    @property
    def engine(self) -> str:
        return str(self.model.backend.name)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.tokenizer is not None and self.tokenizer.eos_token_ids:
            return self.tokenizer.eos_token_ids
        return self.config.eos_token_ids

    def __repr__(self) -> str:
        c = self.config
        return f"LLM({c.model_type}, {c.num_layers} layers, quant={self.quant}, engine={self.engine}, device={self.model.device})"

    # -- prompts --------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self._tok().encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)  # type: ignore[arg-type]
        if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            return self._tok().apply_chat_template(prompt)  # type: ignore[arg-type]
        raise TypeError("a prompt is a string, a list of chat messages ({'role', 'content'}) or a list of token ids")

    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{self.path}: no tokenizer.json, so prompts must be token ids")
        return self.tokenizer

    @staticmethod
    def _is_batch(prompt: Any) -> bool:
        return (
            isinstance(prompt, list)
            and bool(prompt)
            and all(isinstance(p, (str, list)) for p in prompt)
            and not all(isinstance(p, dict) for p in prompt)
        )

    # -- generation -----------------------------------------------------------------------
    def generate(
        self,
        prompt: Prompt | list[Prompt],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        n: int = 1,
        speculative: Any = None,
        json_schema: JsonSchemaSpec | None = None,
    ) -> Generation | list[Generation]:
        """Generate from one prompt (-> ``Generation``) or a list of prompts as one batch
        (-> list). Greedy when ``temperature`` is 0.

        ``logprobs``: ``None`` (off), or ``k`` in 0..20: each generated token's log-probability
        under the model (raw logits, before sampling settings) and its ``k`` likeliest
        alternatives, in ``Generation.logprobs``.
        ``n``: samples of one prompt (-> list of ``n``), decoded together; with ``seed``, sample
        ``i`` uses seed ``seed + i``, so it is what ``n=1, seed=seed + i`` gives (the server's
        ``n`` / ``seed`` follow the same rule).
        ``speculative``: ``"ngram"`` (prompt lookup), a draft ``LLM`` with the same tokenizer, or a
        dict such as ``{"method": "ngram", "num_tokens": 6, "ngram": 3}`` (see
        :mod:`tb_llm.speculative`): drafts verified several tokens per step, one prompt at a time;
        greedy output is the plain greedy output.
        ``json_schema``: structured output (needs the ``structured`` extra): ``True`` or
        ``"json_object"`` for any JSON object, or a JSON schema (``dict`` or its JSON text); every
        step samples only tokens the schema allows (greedy or sampled) and generation stops once
        the JSON value is complete (``finish_reason`` ``"stop"``; ``"length"`` if
        ``max_new_tokens`` cut it short). A bad schema raises
        :class:`~tb_llm.structured.StructuredOutputError` (a ``ValueError``).
        """
        check_top(logprobs)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        batch = self._is_batch(prompt)
        if n > 1 and batch:
            raise ValueError("n > 1 takes one prompt, not a batch of prompts")
        prompts = list(prompt) if batch else [prompt] * n  # type: ignore[list-item, arg-type]
        ids = [self.encode(p) for p in prompts]  # type: ignore[arg-type]
        params = SamplingParams(temperature, top_k, top_p, min_p, repetition_penalty)
        schema = self._schema(json_schema)
        seqs = [_Seq(self, p, stop, self._constraint(schema)) for p in ids]
        timing = Timing(load_seconds=self.load_seconds)
        generators = _choice_generators(seed, n) if n > 1 else None
        spec = self._speculative(speculative, seqs)
        steps = (
            speculative_run(self, seqs[0], spec, params, max_new_tokens, seed, ignore_eos, timing, logprobs)
            if spec is not None
            else self._run(
                seqs, params, max_new_tokens, seed, ignore_eos, timing, logprobs=logprobs, generators=generators
            )
        )
        for _ in steps:
            pass
        out = [
            Generation(
                s.text,
                s.ids,
                s.prompt_ids,
                s.finish_reason or "length",
                timing,
                s.logprobs if logprobs is not None else None,
            )
            for s in seqs
        ]
        return out if batch or n > 1 else out[0]

    def stream(
        self,
        prompt: Prompt,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        ignore_eos: bool = False,
        result: list[Generation] | None = None,
        logprobs: int | None = None,
        speculative: Any = None,
        json_schema: JsonSchemaSpec | None = None,
    ) -> Iterator[str]:
        """Yield text deltas as they are generated; each delta is whole UTF-8 characters.
        Pass ``result=[]`` to receive the final ``Generation`` in it. With ``logprobs=k`` the
        deltas are :class:`TextDelta` strings carrying the entries of their tokens (see
        :meth:`generate`); every generated token's entry comes out in exactly one delta.
        ``json_schema``: structured output, as in :meth:`generate`."""
        check_top(logprobs)
        seq = _Seq(self, self.encode(prompt), stop, self._constraint(self._schema(json_schema)))
        params = SamplingParams(temperature, top_k, top_p, min_p, repetition_penalty)
        timing = Timing(load_seconds=self.load_seconds)
        spec = self._speculative(speculative, [seq])
        steps = (
            speculative_run(self, seq, spec, params, max_new_tokens, seed, ignore_eos, timing, logprobs)
            if spec is not None
            else self._run([seq], params, max_new_tokens, seed, ignore_eos, timing, logprobs=logprobs)
        )
        for _ in steps:
            delta = seq.take_delta()
            if logprobs is not None:
                yield TextDelta(delta, seq.take_logprobs())
            elif delta:
                yield delta
        delta = seq.take_delta()
        if delta:
            yield TextDelta(delta) if logprobs is not None else delta
        if result is not None:
            result.append(
                Generation(
                    seq.text,
                    seq.ids,
                    seq.prompt_ids,
                    seq.finish_reason or "length",
                    timing,
                    seq.logprobs if logprobs is not None else None,
                )
            )

    @staticmethod
    def _schema(spec: JsonSchemaSpec | None) -> Schema | None:
        if spec is None or spec is False:
            return None
        from tb_llm.structured import compile_schema

        return compile_schema(spec)

    def _constraint(self, schema: Schema | None) -> Constraint | None:
        """A fresh grammar state for one sequence (None without a schema)."""
        if schema is None:
            return None
        from tb_llm.structured import constraint_for

        return constraint_for(self.tokenizer, self.config.vocab_size, self.eos_token_ids, schema)

    @staticmethod
    def _speculative(speculative: Any, seqs: list[_Seq]) -> Speculative | None:
        spec = parse_speculative(speculative)
        if spec is not None:
            if len(seqs) > 1:
                raise ValueError("speculative decoding takes one prompt (n=1, not a batch)")
            if getattr(seqs[0], "constraint", None) is not None:
                raise ValueError("speculative decoding and json_schema cannot be combined yet")
        return spec

    def score(self, text: str | list[int], ctx: int | None = None, stride: int | None = None) -> Score:
        """Log-probability of every token of ``text`` (a string, encoded with BOS as ``generate``
        encodes, or token ids) under the model, and the perplexity.

        A text of at most ``ctx`` tokens (default: the model's context length) is one window and
        every token but the first is scored. A longer one is cut as llama.cpp's
        ``llama-perplexity -c ctx [--ppl-stride stride]`` cuts it (see :mod:`tb_llm.perplexity`):
        chunks of ``ctx`` scoring their second half, or with ``stride``, windows every ``stride``
        tokens scoring their last ``stride``.
        """
        ids = self.encode(text) if isinstance(text, str) else list(text)
        vocab = self.config.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise ValueError(f"token ids must be integers in [0, {vocab})")
        window = ctx if ctx is not None else self.config.max_position
        if window > self.config.max_position:
            raise ValueError(f"ctx {window} is beyond the model's context length {self.config.max_position}")
        bos = self.tokenizer.bos_token_id if self.tokenizer is not None else None
        # llama-perplexity puts BOS at the start of each chunk when its tokenizer adds one.
        adds_bos = bos is not None and self.tokenizer is not None and self.tokenizer.encode("a")[:1] == [bos]
        return score_tokens(self.model, ids, window, stride, bos if adds_bos else None)

    def _run(
        self,
        seqs: list[_Seq],
        params: SamplingParams,
        max_new_tokens: int,
        seed: int | None,
        ignore_eos: bool,
        timing: Timing,
        cache: Any = None,
        feed: list[list[int]] | None = None,
        start: int = 0,
        logprobs: int | None = None,
        generators: list[torch.Generator] | None = None,
    ) -> Iterator[None]:
        """The prefill + decode loop over a batch; yields after every step.

        ``cache``/``feed``/``start``: continue an existing cache (chat) by feeding only the
        tokens after the shared prefix, which sit at positions ``start`` onwards.
        ``generators``: one per row (independent samples per row), instead of one seeded by
        ``seed`` for the whole batch.
        """
        model = self.model
        dev = model.device
        prefix = self.prefix_cache if cache is None and feed is None and len(seqs) == 1 else None
        if prefix is not None:
            blocks = prefix.lookup(seqs[0].prompt_ids)
            if blocks:
                cache = model.new_cache(1, len(seqs[0].prompt_ids) + max_new_tokens)
                start = _load_blocks(cache, blocks, dev)
                feed = [seqs[0].prompt_ids[start:]]
        rows = feed if feed is not None else [s.prompt_ids for s in seqs]
        if any(not r for r in rows):
            raise ValueError("empty prompt: encode at least one token")
        b, n = len(rows), max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else 0
        ids = torch.full((b, n), pad, dtype=torch.long)
        pos = torch.full((b, n), -1, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, n - len(r) :] = torch.tensor(r)
            pos[i, n - len(r) :] = torch.arange(start, start + len(r))
        if cache is None:
            cache = model.new_cache(b, n + max_new_tokens)
        else:
            cache.reserve(cache.length + n + max_new_tokens)
        eos = set() if ignore_eos else set(self.eos_token_ids)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        vocab = model.cfg.vocab_size
        seen = None
        if params.repetition_penalty != 1.0:
            seen = zeros((b, vocab), torch.bool, "cpu")
            for i, s in enumerate(seqs):
                seen[i, torch.tensor(s.prompt_ids, dtype=torch.long).clamp(0, vocab - 1)] = True
        last = pos[:, -1].clone()
        t0 = time.perf_counter()
        logits = model.forward(ids.to(dev), pos.to(dev), cache)
        pieces = TokenPieces(self.tokenizer) if logprobs is not None else None
        constrained = any(s.constraint is not None for s in seqs)
        for step in range(max_new_tokens):
            raw = log_softmax(logits).cpu() if logprobs is not None else None
            if seen is not None:
                logits = apply_repetition_penalty(logits, seen.to(logits.device), params.repetition_penalty)
            cpu = logits.float().cpu()
            if constrained:
                # a copy (the model's logits may be inference tensors: no in-place writes) made by
                # numpy, single-threaded: a torch copy of a [B, V] row wakes the intra-op pool,
                # whose spinning threads then slow the next forward on a busy machine
                cpu = torch.from_numpy(cpu.numpy().copy())
                for i, s in enumerate(seqs):
                    if s.constraint is not None and s.finish_reason is None:
                        s.constraint.mask(cpu[i])  # only what the grammar allows next (raw log-probs unaffected)
            if generators is not None:
                nxt = torch.cat([sample(cpu[i : i + 1], params, g) for i, g in enumerate(generators)])
            else:
                nxt = sample(cpu, params, gen)
            now = time.perf_counter()
            if step == 0:
                timing.prefill_tokens += sum(len(r) for r in rows)
                timing.prefill_seconds += now - t0
            else:
                timing.decode_tokens += sum(1 for s in seqs if s.finish_reason is None)
                timing.decode_seconds += now - t0
            chosen = nxt.tolist()  # one conversion for the batch, not a tensor index per row
            for i, s in enumerate(seqs):
                if s.finish_reason is None:
                    tok = chosen[i]
                    if raw is not None and pieces is not None and logprobs is not None:
                        s.logprobs.append(token_logprob(raw[i], tok, logprobs, pieces))
                    s.add(tok, tok in eos)
                    if s.constraint is not None and s.finish_reason is None:
                        s.constraint.advance(tok)
                        if s.constraint.done:  # the JSON value is complete: only EOS could follow
                            s.finish("stop")
            if seen is not None:
                seen[torch.arange(b), nxt.clamp(0, vocab - 1)] = True
            if step == max_new_tokens - 1:
                for s in seqs:
                    s.finish("length")
            yield None
            if all(s.finish_reason is not None for s in seqs):
                break
            last = last + 1
            t0 = time.perf_counter()
            logits = model.forward(nxt[:, None].to(dev), last[:, None].to(dev), cache)
        for s in seqs:
            s.finish("length")
        self._last_cache = cache
        if prefix is not None:  # the cache holds the prompt and every generated token but the last
            held = (seqs[0].prompt_ids + seqs[0].ids)[: cache.length]
            prefix.insert(held, lambda a, b: _read_slots(cache, a, b))

    # -- chat -----------------------------------------------------------------------------
    def chat_session(self, system_prompt: str | None = None) -> ChatSession:
        return ChatSession(self, system_prompt)

    def chat(
        self,
        system_prompt: str | None = None,
        max_new_tokens: int = 512,
        input_fn: Callable[[str], str] = input,
        output: Any = None,
        **sampling: Any,
    ) -> None:
        """Interactive multi-turn chat on the terminal. ``/reset`` forgets the conversation,
        ``/exit`` (or end of input) leaves. The KV cache is kept across turns: each turn only
        prefills the tokens the previous turns did not already hold."""
        out = output or sys.stdout
        session = self.chat_session(system_prompt)
        while True:
            try:
                line = input_fn(">>> ")
            except (EOFError, KeyboardInterrupt):
                out.write("\n")
                break
            if line.strip() in ("/exit", "/quit"):
                break
            if line.strip() == "/reset":
                session.reset()
                continue
            if not line.strip():
                continue
            for delta in session.stream(line, max_new_tokens=max_new_tokens, **sampling):
                out.write(delta)
                out.flush()
            t = session.last.timing if session.last else Timing()
            out.write(
                f"\n[{t.prefill_tokens} prompt tokens at {t.prefill_tok_s:.1f} tok/s prefill,"
                f" {t.decode_tokens} tokens at {t.decode_tok_s:.1f} tok/s decode]\n"
            )


class ChatSession:
    """A conversation whose KV cache survives between turns."""

    def __init__(self, llm: LLM, system_prompt: str | None = None) -> None:
        self.llm = llm
        self.system_prompt = system_prompt
        self.last: Generation | None = None
        self.reset()

    def reset(self) -> None:
        self.messages: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        self.cache: Any = self.llm.model.new_cache(1, 256)
        self.cached: list[int] = []  # the tokens whose keys/values the cache holds, in order

    def send(self, text: str, **kwargs: Any) -> Generation:
        for _ in self.stream(text, **kwargs):
            pass
        assert self.last is not None
        return self.last

    def stream(
        self,
        text: str,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
    ) -> Iterator[str]:
        self.messages.append({"role": "user", "content": text})
        ids = self.llm._tok().apply_chat_template(self.messages, add_generation_prompt=True)
        common = 0
        for a, b in zip(self.cached, ids[:-1]):  # keep >= 1 token to feed
            if a != b:
                break
            common += 1
        self.cache.truncate(common)
        seq = _Seq(self.llm, ids, stop)
        params = SamplingParams(temperature, top_k, top_p, min_p, repetition_penalty)
        timing = Timing()
        for _ in self.llm._run(
            [seq], params, max_new_tokens, seed, False, timing, cache=self.cache, feed=[ids[common:]], start=common
        ):
            delta = seq.take_delta()
            if delta:
                yield delta
        delta = seq.take_delta()
        if delta:
            yield delta
        # Every generated token but the last was fed back, so the cache holds prompt + those.
        self.cached = ids + seq.ids[:-1]
        self.messages.append({"role": "assistant", "content": seq.text})
        self.last = Generation(seq.text, seq.ids, ids, seq.finish_reason or "length", timing)


def _choose_backend(
    device: str, engine: str | None, cfg: ModelConfig, quant: str, group_size: int
) -> tuple[LLMKernels, dict[str, Any]]:
    """The kernel backend for a load, and what ``info()`` says about the choice: ``device="auto"``
    without an engine measures the installed backends (:mod:`tb_llm.auto_device`)."""
    if device == "auto" and engine is None:
        from tb_llm.auto_device import auto_select

        backend, record = auto_select(cfg, quant, group_size)
        return backend, {"device_choice": record}
    return select_backend(resolve_device(device), engine, requested=device), {}


def _load_blocks(cache: Any, blocks: Sequence[Any], dev: torch.device) -> int:
    """Write prefix-cache blocks into the empty one-row ``cache`` at positions 0.. through the
    cache protocol (begin / write / commit); return the tokens it now holds."""
    n = sum(b.k.shape[2] for b in blocks)
    cache.begin(torch.arange(n, dtype=torch.long, device=dev)[None])
    for layer in range(cache.num_layers):
        k = torch.cat([b.k[layer] for b in blocks], dim=1)[None]
        v = torch.cat([b.v[layer] for b in blocks], dim=1)[None]
        cache.write(layer, k, v)
    cache.commit(n)
    return n


def _read_slots(cache: Any, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0's keys and values of slots ``a..b``, every layer: ``[layers, kv_heads, b - a, head_dim]``."""
    k = torch.stack([cache.k[i][0, :, a:b] for i in range(cache.num_layers)])
    v = torch.stack([cache.v[i][0, :, a:b] for i in range(cache.num_layers)])
    return k, v


def _choice_generators(seed: int | None, n: int) -> list[torch.Generator]:
    """Choice ``i`` of ``n`` samples with seed ``seed + i`` (unseeded: fresh random seeds)."""
    gens = []
    for i in range(n):
        g = torch.Generator()
        if seed is not None:
            g.manual_seed((seed + i) % (1 << 64))
        else:
            g.seed()
        gens.append(g)
    return gens


def _progress_bar(total: int, desc: str, enabled: bool | None) -> Any:
    if enabled is None:
        enabled = sys.stderr.isatty() and total > 64
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="tensor", leave=False)
