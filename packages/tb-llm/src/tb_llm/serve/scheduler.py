"""Continuous batching: one thread owns the model and runs every live request in one step.

Requests wait in a queue; at each step boundary the scheduler admits as many as there are free
rows (prefilling each into its row), then runs one decode step for all live rows together.
Finished and cancelled requests leave the batch at the next boundary and their row is reused
at once. The thread never waits on a client: results go out through a per-request callback
that must not block (the HTTP layer puts them on the request's own asyncio queue).

Speculative decoding (prompt lookup, a job's ``speculative``) runs when that job is the only one
in the batch: its step feeds the last token and the drafts as one forward pass over its row and
keeps what the model accepts (:func:`tb_llm.speculative.verify`). With other rows live, a verify
step per speculating row would read the weights once more per row and slow every other request,
so such a job decodes in the shared step like any other until it is alone again (greedy output is
the same either way).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tb_llm.llm import LLM
from tb_llm.logprobs import TokenLogprob, TokenPieces, log_softmax, token_logprob
from tb_llm.sampling import greedy as argmax
from tb_llm.serve.batch_engine import BatchEngine
from tb_llm.serve.completion_text import CompletionText
from tb_llm.serve.metrics import ServerMetrics
from tb_llm.serve.prefix_cache import PrefixCache, reuse_blocker
from tb_llm.serve.row_sampler import RequestSampling, RowSampler
from tb_llm.speculative import PAUSE, Speculative, lookup_draft, verify
from tb_llm.structured import StructuredOutputError

log = logging.getLogger("tb_llm.serve")


@dataclass(frozen=True)
class Delta:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens generated since the last delta (with logprobs on)


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    token_ids: tuple[int, ...]
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # prompt tokens 1.. (echo with logprobs)


@dataclass(frozen=True)
class Failed:
    message: str


Event = Delta | Finished | Failed


class Busy(Exception):
    """Every row is taken and the waiting queue is full."""


class Job:
    """One request in the scheduler. ``cancel()`` is safe from any thread."""

    def __init__(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: RequestSampling,
        stop: Sequence[str],
        ignore_eos: bool,
        emit: Callable[[Event], None],
        logprobs: int | None = None,
        prompt_logprobs: bool = False,
        speculative: Speculative | None = None,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.speculative = speculative  # prompt lookup when alone in the batch (see the module)
        # the draft length adapts as in tb_llm.speculative.run: doubled after a step that
        # accepted every draft, halved after one that accepted none, retried after PAUSE plain steps
        self.spec_width = speculative.num_tokens if speculative is not None else 0
        self.spec_plain_steps = 0
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.stop = list(stop)
        self.ignore_eos = ignore_eos
        self.emit = emit
        self.logprobs = logprobs  # None: off; k: alternatives per token
        self.prompt_logprobs = prompt_logprobs
        self.prompt_entries: tuple[TokenLogprob, ...] | None = None
        self.pending_entries: list[TokenLogprob] = []
        self.last_token_at: float | None = None
        self.closed = False  # counted in the metrics as ended
        self.cancelled = False
        self.done = False
        self.ids: list[int] = []
        self.submitted = time.perf_counter()
        self.first_token_at: float | None = None
        self.text: CompletionText | None = None
        self.sampler: RowSampler | None = None
        self.finish_reason: str | None = None

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    def __init__(
        self,
        llm: LLM,
        max_batch: int = 16,
        max_queue: int = 256,
        prefill_tokens_per_step: int = 4096,
        metrics: ServerMetrics | None = None,
        prefix_cache_mb: float = 0.0,
        prefix_block_tokens: int = 32,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 turns the prefix cache off), got {prefix_cache_mb}")
        self.llm = llm
        # Why this model cannot reuse a prefix's keys (then the cache stays off), or None.
        self.prefix_cache_blocker = reuse_blocker(llm.config.rope.rope_type)
        if self.prefix_cache_blocker is not None and prefix_cache_mb > 0:
            log.warning("prefix cache off: %s", self.prefix_cache_blocker)
        budget = 0 if self.prefix_cache_blocker is not None else int(prefix_cache_mb * (1 << 20))
        self.prefix_cache = PrefixCache(budget, prefix_block_tokens)
        self.engine = BatchEngine(llm, max_batch, prefix_cache=self.prefix_cache)
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.prefill_tokens_per_step = prefill_tokens_per_step
        self.eos = frozenset(llm.eos_token_ids)
        self.vocab = llm.config.vocab_size
        self.metrics = metrics or ServerMetrics()
        self.pieces = TokenPieces(llm.tokenizer)
        self._pending: deque[Job] = deque()
        self._active: list[Job] = []  # job i lives in cache row i
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.generated_tokens = 0
        self.peak_batch = 0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        with self._cv:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="tb-llm-scheduler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def load(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        return len(self._active), len(self._pending)

    # -- requests -------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue ``job``; raises :class:`Busy` when the batch and the queue are both full."""
        self.submit_all([job])

    def submit_all(self, jobs: Sequence[Job]) -> None:
        """Queue every job of ``jobs`` (a request's ``n`` choices) or, if they do not all fit,
        none of them (:class:`Busy`)."""
        if any(not job.prompt_ids for job in jobs):
            raise ValueError("empty prompt: encode at least one token")
        with self._cv:
            if len(self._active) + len(self._pending) + len(jobs) > self.max_batch + self.max_queue:
                raise Busy(
                    f"the server is at its limit ({self.max_batch} running, {self.max_queue} waiting); retry later"
                )
            self._pending.extend(jobs)
            self._cv.notify()
        self.start()

    # -- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._pending and not self._active:
                    self._cv.wait()
                if self._stopping:
                    break
                admitted = self._admit()
            for job in admitted:
                try:
                    self._prefill(job)
                except Exception as exc:  # this prompt only: the others keep going
                    log.exception("prefill failed")
                    job.done = True
                    self._send(job, Failed(f"prefill failed: {type(exc).__name__}: {exc}"))
                    self._close(job, "error")
            try:
                self._drop_finished()
                if self._active:
                    self._decode()
                    self._drop_finished()
            except Exception as exc:  # a model error fails the batch, not the server
                log.exception("batch step failed")
                for job in self._active:
                    if not job.done:
                        job.done = True
                        self._send(job, Failed(f"generation failed: {type(exc).__name__}: {exc}"))
                        self._close(job, "error")
                self._active.clear()
                # a fresh cache, whatever state it was in (the prefix cache holds copies: it stays)
                self.engine = BatchEngine(self.llm, self.max_batch, prefix_cache=self.prefix_cache)
        for job in list(self._active) + list(self._pending):
            if not job.done:
                job.done = True
                self._send(job, Failed("the server is shutting down"))
                self._close(job, "error")
        self._active.clear()
        self._pending.clear()

    def _admit(self) -> list[Job]:
        """Pop waiting jobs into free rows, within the per-step prefill budget (called locked)."""
        admitted: list[Job] = []
        budget = self.prefill_tokens_per_step
        while self._pending and len(self._active) + len(admitted) < self.max_batch:
            job = self._pending[0]
            if job.cancelled:
                self._pending.popleft()
                job.done = True
                self._close(job, "cancelled")
                continue
            if admitted and len(job.prompt_ids) > budget:
                break  # a long prompt waits for the next boundary instead of stalling this one
            budget -= len(job.prompt_ids)
            admitted.append(self._pending.popleft())
        return admitted

    def _prefill(self, job: Job) -> None:
        row = len(self._active)
        self._active.append(job)
        self.peak_batch = max(self.peak_batch, len(self._active))
        job.text = CompletionText(self.llm.tokenizer, job.stop)
        job.sampler = RowSampler(job.sampling, job.prompt_ids, self.vocab)
        logits = self.engine.prefill(row, job.prompt_ids, all_logits=job.prompt_logprobs)
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))
        if job.prompt_logprobs:
            lsm = log_softmax(logits)
            k = job.logprobs or 0
            job.prompt_entries = tuple(
                token_logprob(lsm[t - 1], job.prompt_ids[t], k, self.pieces) for t in range(1, len(job.prompt_ids))
            )
            logits = logits[-1]
        if job.max_tokens == 0:  # echo only: the prompt is scored, nothing is generated
            assert job.text is not None
            job.text.finish()
            job.finish_reason = "length"
            job.done = True
            self._send(job, Finished("length", len(job.prompt_ids), 0, (), job.prompt_entries))
            self._close(job, "length")
            self._remember(row, job)
            return
        self._accept(job, job.sampler.pick(logits), logits)
        # After the first token went out (not on its critical path): requests arriving while
        # this one decodes already find its prompt.
        self._remember(row, job)

    def _remember(self, row: int, job: Job) -> None:
        """Offer what row ``row`` holds (the job's prompt, then what it generated) to the prefix cache."""
        try:
            self.engine.remember(row, job.prompt_ids + job.ids)
        except Exception:  # the cache is an optimisation: a failure to fill it fails no request
            log.exception("prefix cache insert failed")

    def _decode(self) -> None:
        jobs = self._active
        if len(jobs) == 1 and jobs[0].speculative is not None and not jobs[0].done and self._speculate(jobs[0]):
            return
        logits = self.engine.decode([j.ids[-1] for j in jobs])
        self.steps += 1
        greedy = None
        for i, job in enumerate(jobs):
            if job.done:
                continue
            assert job.sampler is not None
            if job.sampling.plain_greedy:
                if greedy is None:
                    greedy = argmax(logits)
                tok = int(greedy[i])
                job.sampler.observe(tok)
            else:
                try:
                    tok = job.sampler.pick(logits[i])
                except StructuredOutputError as exc:  # this row's grammar failed: only its request ends
                    log.warning("structured output failed: %s", exc)
                    job.done = True
                    self._send(job, Failed(str(exc)))
                    self._close(job, "error")
                    continue
            self._accept(job, tok, logits[i])

    def _speculate(self, job: Job) -> bool:
        """One verify step for ``job``, alone in row 0; False (nothing done) when there is no
        draft to verify this step: the caller runs the plain step."""
        spec, sampler = job.speculative, job.sampler
        assert spec is not None and sampler is not None
        if sampler.constraint is not None or sampler.counts is not None or sampler.bias is not None:
            return False  # logits the verify step's sampler does not reproduce (the app refuses these)
        if job.spec_width == 0:
            job.spec_plain_steps += 1
            if job.spec_plain_steps > PAUSE:
                job.spec_width, job.spec_plain_steps = 1, 0
        k = min(job.spec_width, job.max_tokens - len(job.ids) - 1)  # the bonus token needs room too
        draft = lookup_draft(job.prompt_ids + job.ids, k, spec.ngram, spec.min_ngram) if k > 0 else []
        if not draft:
            return False
        held = self.engine.cache.lens[0]  # every token but the last emitted one
        logits = self.engine.extend(0, [job.ids[-1], *draft])
        emitted, accepted = verify(logits, draft, [None] * len(draft), sampler.params, sampler.generator, sampler.seen)
        self.engine.truncate(0, held + 1 + accepted)
        self.steps += 1
        self.metrics.spec_steps.inc()
        self.metrics.spec_proposed.inc(len(draft))
        self.metrics.spec_accepted.inc(accepted)
        if accepted == len(draft):
            job.spec_width = min(spec.num_tokens, 2 * job.spec_width)
        elif accepted == 0:
            job.spec_width //= 2
        for j, tok in enumerate(emitted):
            if job.done:
                break
            sampler.observe(tok)
            self._accept(job, tok, logits[j])
        return True

    def _accept(self, job: Job, tok: int, logits: torch.Tensor) -> None:
        assert job.text is not None
        if job.cancelled:
            job.done = True
            return
        now = time.perf_counter()
        if job.first_token_at is None:
            job.first_token_at = now
            self.metrics.ttft.observe(now - job.submitted)
        elif job.last_token_at is not None:
            self.metrics.itl.observe(now - job.last_token_at)
        job.last_token_at = now
        job.ids.append(tok)
        self.generated_tokens += 1
        self.metrics.generation_tokens.inc()
        eos = tok in self.eos and not job.ignore_eos
        if job.logprobs is not None and not eos:  # the EOS token is not part of the text
            job.pending_entries.append(token_logprob(log_softmax(logits), tok, job.logprobs, self.pieces))
        if eos or job.text.push(tok) or (job.sampler is not None and job.sampler.complete):
            job.finish_reason = "stop"  # EOS, a stop string, or a complete response_format JSON value
        elif len(job.ids) >= job.max_tokens:
            job.finish_reason = "length"
        if job.finish_reason is not None:
            job.text.finish()
        delta = job.text.take()
        if delta or job.pending_entries:
            self._send(job, Delta(delta, tuple(job.pending_entries)))
            job.pending_entries = []
        if job.finish_reason is not None:
            job.done = True
            self._send(
                job,
                Finished(job.finish_reason, len(job.prompt_ids), len(job.ids), tuple(job.ids), job.prompt_entries),
            )
            self._close(job, job.finish_reason)

    def _close(self, job: Job, reason: str) -> None:
        """Count ``job``'s end once, whichever path ended it."""
        if job.closed:
            return
        job.closed = True
        self.metrics.finished.inc(label=reason)
        self.metrics.e2e.observe(time.perf_counter() - job.submitted)

    def _drop_finished(self) -> None:
        """Free the rows of finished / cancelled jobs, keeping live rows packed at the front."""
        jobs = self._active
        for i in range(len(jobs) - 1, -1, -1):
            if jobs[i].cancelled:
                jobs[i].done = True
            if jobs[i].done:
                self._close(jobs[i], "cancelled")  # a no-op for jobs that finished
                if jobs[i].finish_reason is not None:  # prompt + completion: the next chat turn's prefix
                    self._remember(i, jobs[i])
                last = len(jobs) - 1
                self.engine.release(i, last)
                jobs[i] = jobs[last]
                jobs.pop()

    @staticmethod
    def _send(job: Job, event: Event) -> None:
        try:
            job.emit(event)
        except Exception:  # the client's event loop is gone; the job is over either way
            job.cancelled = True
