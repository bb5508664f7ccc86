"""Continuous batching without HTTP: the scheduler against ``LLM.generate``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tb_llm import LLM
from tb_llm.serve.row_sampler import RequestSampling
from tb_llm.serve.scheduler import Delta, Event, Failed, Finished, Job, Scheduler
from tb_llm.serve.slot_cache import SlotCache

PROMPTS = ["Hello", "The quick brown fox", "Grüße aus München", "def main():", "日本語", "TorchBurn runs"]
GREEDY = RequestSampling(temperature=0.0)


class Collector:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.finished = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, (Finished, Failed)):
            self.finished.set()

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Delta))

    @property
    def result(self) -> Finished:
        assert self.finished.wait(60), "job did not finish"
        last = self.events[-1]
        assert isinstance(last, Finished), last
        return last


def _job(llm: LLM, prompt: str, n: int, sampling: RequestSampling = GREEDY, **kw: object) -> tuple[Job, Collector]:
    c = Collector()
    job = Job(llm.encode(prompt), n, sampling, kw.pop("stop", ()), bool(kw.pop("ignore_eos", True)), c)  # type: ignore[arg-type]
    return job, c


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2", "qwen3"])
def test_concurrent_greedy_equals_generate(make_ckpt: Callable[[str], Path], arch: str) -> None:
    llm = LLM.from_pretrained(make_ckpt(arch), device="cpu")
    sched = Scheduler(llm, max_batch=4)
    try:
        jobs = [_job(llm, p, 12 + 3 * i) for i, p in enumerate(PROMPTS)]  # more jobs than rows
        for job, _ in jobs:
            sched.submit(job)
        for (job, c), p in zip(jobs, PROMPTS):
            want = llm.generate(p, max_new_tokens=job.max_tokens, ignore_eos=True)
            assert isinstance(want, object) and not isinstance(want, list)
            got = c.result
            assert list(got.token_ids) == want.token_ids, p
            assert c.text == want.text
            assert got.finish_reason == "length"
        assert sched.peak_batch == 4  # the requests really shared decode steps
    finally:
        sched.stop()


def test_join_mid_flight_and_seeded_sampling(llama: LLM) -> None:
    sched = Scheduler(llama, max_batch=8)
    try:
        long, c_long = _job(llama, "The quick brown fox", 60)
        sched.submit(long)
        while len(long.ids) < 10:  # the first request is well into its decode
            time.sleep(0.001)
        s = RequestSampling(temperature=0.9, top_p=0.95, top_k=40, seed=1234)
        late, c_late = _job(llama, "Hello", 20, s)
        sched.submit(late)
        want_late = llama.generate(
            "Hello", max_new_tokens=20, temperature=0.9, top_p=0.95, top_k=40, seed=1234, ignore_eos=True
        )
        want_long = llama.generate("The quick brown fox", max_new_tokens=60, ignore_eos=True)
        assert not isinstance(want_late, list) and not isinstance(want_long, list)
        assert list(c_late.result.token_ids) == want_late.token_ids
        assert list(c_long.result.token_ids) == want_long.token_ids
    finally:
        sched.stop()


def test_cancel_frees_the_row(llama: LLM) -> None:
    sched = Scheduler(llama, max_batch=1, max_queue=1)
    try:
        a, _ = _job(llama, "Hello", 100_000)
        sched.submit(a)
        b, c_b = _job(llama, "Hello", 5)
        sched.submit(b)  # waits: the only row is taken
        while not a.ids:
            time.sleep(0.001)
        assert sched.load == (1, 1)
        a.cancel()
        assert c_b.result.completion_tokens == 5
        deadline = time.monotonic() + 10
        while sched.load != (0, 0) and time.monotonic() < deadline:  # b leaves at the step boundary
            time.sleep(0.001)
        assert sched.load == (0, 0)
    finally:
        sched.stop()


def test_stop_string_and_eos(llama: LLM) -> None:
    full = llama.generate("Hello", max_new_tokens=30, ignore_eos=True)
    assert not isinstance(full, list)
    stop = full.text[8:12]
    want = llama.generate("Hello", max_new_tokens=30, stop=[stop])
    assert not isinstance(want, list)
    sched = Scheduler(llama, max_batch=2)
    try:
        job, c = _job(llama, "Hello", 30, stop=[stop], ignore_eos=False)
        sched.submit(job)
        assert c.result.finish_reason == want.finish_reason == "stop"
        assert c.text == want.text == full.text[: full.text.find(stop)]
    finally:
        sched.stop()


def test_slot_cache_rows_grow_independently() -> None:
    cache = SlotCache(
        num_layers=1, rows=3, kv_heads=1, head_dim=2, capacity=2, dtype=torch.float32, device=torch.device("cpu")
    )
    view = cache.prefill_view(1)
    view.begin(torch.arange(5)[None])
    k = torch.arange(10, dtype=torch.float32).reshape(1, 1, 5, 2)
    k_all, _ = view.write(0, k, k)
    view.commit(5)
    assert cache.lens == [0, 5, 0] and cache.capacity >= 5
    assert torch.equal(k_all[0, 0], k[0, 0])
    cache.move(1, 0)
    assert cache.lens == [5, 0, 0]
    assert cache.pos[1].eq(-1).all() and cache.pos[0, :5].tolist() == [0, 1, 2, 3, 4]
    dv = cache.decode_view(2)  # row 0 holds 5 tokens, row 1 none
    dv.begin(torch.tensor([[5], [0]]))
    one = torch.ones(2, 1, 1, 2)
    k_all, _ = dv.write(0, one, one)
    dv.commit(1)
    assert cache.lens[:2] == [6, 1]
    assert k_all.shape == (2, 1, 6, 2)
    assert cache.pos[1, :6].tolist() == [0, -1, -1, -1, -1, -1]
