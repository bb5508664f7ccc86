"""The server's prefix cache: requests that share a token prefix reuse its keys and values, and
their outputs equal the uncached ones (``LLM.generate``) token for token."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
import torch

from tb_llm import LLM
from tb_llm.serve import BackgroundServer, ServeSettings
from tb_llm.serve.prefix_cache import PrefixCache, block_keys
from tb_llm.serve.row_sampler import RequestSampling
from tb_llm.serve.scheduler import Event, Failed, Finished, Job, Scheduler

GREEDY = RequestSampling(temperature=0.0)
SYSTEM = (
    "You are a careful assistant for TorchBurn. The quick brown fox jumps over the lazy dog. "
    "Answer in short sentences and quote the manual where you can."
)
USERS = ["Hello", "The quick brown fox", "Grüße aus München", "def main():", "日本語", "TorchBurn runs"]


class Collector:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.done = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, (Finished, Failed)):
            self.done.set()

    def result(self) -> Finished:
        assert self.done.wait(120), "the job did not finish"
        last = self.events[-1]
        assert isinstance(last, Finished), last
        return last


def _run(sched: Scheduler, prompts: list[list[int]], new_tokens: int = 10) -> list[list[int]]:
    """Submit every prompt at once (they share decode steps); their generated token ids."""
    jobs = [(Job(p, new_tokens, GREEDY, (), True, c), c) for p in prompts for c in [Collector()]]
    for job, _ in jobs:
        sched.submit(job)
    return [list(c.result().token_ids) for _, c in jobs]


def _want(llm: LLM, prompt: list[int], new_tokens: int = 10) -> list[int]:
    g = llm.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True)
    assert not isinstance(g, list)
    return g.token_ids


def _chat(llm: LLM, user: str, system: str = SYSTEM) -> list[int]:
    return llm.encode([{"role": "system", "content": system}, {"role": "user", "content": user}])


# -- the cache alone ------------------------------------------------------------------------


def _kv(n: int, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2, 1, n, 4), fill), torch.full((2, 1, n, 4), -fill)


def _reader(tokens: list[int]) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    # slot s holds the value tokens[s], so a block's content says where it was read from
    def read(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        vals = torch.tensor(tokens[a:b], dtype=torch.float32)
        k = vals[None, None, :, None].expand(2, 1, b - a, 4).clone()
        return k, -k

    return read


def test_keys_chain_the_whole_prefix() -> None:
    a = block_keys([1, 2, 3, 4, 5, 6], 2, 3)
    b = block_keys([9, 9, 3, 4, 5, 6], 2, 3)
    assert len(a) == 3 and len(set(a)) == 3
    assert a[1] != b[1] and a[2] != b[2]  # same block tokens, other prefix: other key
    assert block_keys([1, 2, 3, 4, 5, 6], 2, 2) == a[:2]


def test_lookup_longest_block_prefix_and_never_the_last_token() -> None:
    pc = PrefixCache(1 << 20, block_tokens=2)
    seq = [5, 6, 7, 8, 9, 10, 11]
    assert pc.insert(seq, _reader(seq)) == 3  # 3 full blocks; the 7th token is no block
    assert pc.insert(seq, _reader(seq)) == 0  # already there
    hit = pc.lookup([5, 6, 7, 8, 1, 2, 3])
    assert [b.tokens for b in hit] == [(5, 6), (7, 8)]
    assert torch.equal(hit[1].k[0, 0, :, 0], torch.tensor([7.0, 8.0]))
    assert torch.equal(hit[1].v[0, 0, :, 0], torch.tensor([-7.0, -8.0]))
    # a prompt equal to a cached prefix leaves its last token to be run
    assert [b.tokens for b in pc.lookup([5, 6, 7, 8])] == [(5, 6)]
    assert pc.lookup([6, 5, 7, 8, 9]) == []  # a different first block: nothing, though block 2 matches
    assert pc.lookup([5]) == []
    s = pc.stats()
    assert (s["hits"], s["misses"], s["tokens_reused"], s["blocks"]) == (2, 2, 6, 3)
    assert s["bytes_held"] == 3 * 2 * (2 * 1 * 2 * 4 * 4)


def test_a_colliding_key_is_not_taken_for_another_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    import tb_llm.serve.prefix_cache as mod

    pc = PrefixCache(1 << 20, block_tokens=2)
    monkeypatch.setattr(mod, "block_keys", lambda tokens, b, n: [bytes([i]) for i in range(n)])  # every prefix collides
    pc.insert([1, 2, 3, 4], _reader([1, 2, 3, 4]))
    assert pc.lookup([1, 2, 9, 9, 0]) != [] and len(pc.lookup([1, 2, 9, 9, 0])) == 1
    assert pc.lookup([7, 7, 3, 4, 0]) == []  # key 0 exists but holds other tokens


def test_lru_eviction_takes_leaves_first_and_keeps_the_budget() -> None:
    block_bytes = 2 * (2 * 1 * 2 * 4 * 4)
    pc = PrefixCache(4 * block_bytes, block_tokens=2)
    a = [1, 1, 2, 2, 3, 3]
    pc.insert(a, _reader(a))  # 3 blocks
    b = [1, 1, 5, 5]  # shares a's first block
    pc.insert(b, _reader(b))  # 1 new block: 4 held
    assert len(pc) == 4 and pc.evictions == 0
    c = [8, 8, 9, 9]
    pc.insert(c, _reader(c))  # 2 new: evicts a's deepest blocks, never the shared root
    assert pc.bytes_held <= pc.budget_bytes and pc.evictions == 2
    assert len(pc.lookup([*b, 0])) == 2
    assert len(pc.lookup([*c, 0])) == 2
    assert len(pc.lookup([*a, 0])) == 1  # only the shared first block is left of a
    # a chain longer than the budget keeps what fits and never evicts its own head
    d = list(range(100, 112))
    pc.insert(d, _reader(d))
    assert pc.bytes_held <= pc.budget_bytes
    assert len(pc.lookup([*d, 0])) == 4


def test_zero_budget_and_bad_arguments() -> None:
    pc = PrefixCache(0)
    assert not pc.enabled and pc.insert([1] * 64, _reader([1] * 64)) == 0 and pc.lookup([1] * 65) == []
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(-1)
    with pytest.raises(ValueError, match="block"):
        PrefixCache(10, block_tokens=0)


# -- through the scheduler ------------------------------------------------------------------


def test_shared_system_prompt_equals_uncached(llama: LLM) -> None:
    sched = Scheduler(llama, max_batch=4, prefix_cache_mb=16, prefix_block_tokens=8)
    try:
        prompts = [_chat(llama, u) for u in USERS]
        assert all(len(p) > 40 for p in prompts)
        got = [_run(sched, [p])[0] for p in prompts]  # one after the other: every later one hits
        assert got == [_want(llama, p) for p in prompts]
        s = sched.prefix_cache.stats()
        assert s["hits"] >= len(USERS) - 1
        assert s["tokens_reused"] >= (len(USERS) - 1) * 32
        assert sched.metrics.prompt_tokens.value() == sum(len(p) for p in prompts)
    finally:
        sched.stop()


def test_multi_turn_reuses_the_previous_completion(llama: LLM) -> None:
    sched = Scheduler(llama, max_batch=2, prefix_cache_mb=16, prefix_block_tokens=4)
    try:
        turn1 = _chat(llama, "Hello")
        out1 = _run(sched, [turn1], new_tokens=24)[0]
        assert out1 == _want(llama, turn1, 24)
        # turn 2 starts with turn 1's prompt and completion (the row held all of it but the last token)
        turn2 = turn1 + out1 + llama.encode([{"role": "user", "content": "And then?"}])[1:]
        before = sched.prefix_cache.tokens_reused
        out2 = _run(sched, [turn2], new_tokens=12)[0]
        assert out2 == _want(llama, turn2, 12)
        reused = sched.prefix_cache.tokens_reused - before
        assert reused > len(turn1)  # blocks of the generated tokens were reused, not only the prompt's
        assert reused == (len(turn1) + len(out1) - 1) // 4 * 4
        # the same through chat messages: whatever the re-encoded text shares with the cache
        text1 = llama.tokenizer.decode(out1) if llama.tokenizer is not None else ""
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": text1},
            {"role": "user", "content": "Tell me more"},
        ]
        ids = llama.encode(msgs)
        assert _run(sched, [ids])[0] == _want(llama, ids)
    finally:
        sched.stop()


def test_concurrent_different_and_overlapping_prefixes(llama: LLM) -> None:
    sched = Scheduler(llama, max_batch=4, prefix_cache_mb=16, prefix_block_tokens=8)
    try:
        other = "Réponds en français, brièvement, et cite le manuel. " * 2
        base = [_chat(llama, u) for u in USERS[:3]] + [_chat(llama, u, other) for u in USERS[:3]]
        # overlapping: one prompt extends another (the first's prompt is the second's prefix)
        ext = base[0] + llama.encode("and more text after it")
        prompts = [*base, ext, base[3]]  # more requests than rows, and a repeat
        _run(sched, prompts[:2])  # warm: some hits happen while others are in flight
        got = _run(sched, prompts)
        assert got == [_want(llama, p) for p in prompts]
        assert sched.peak_batch == 4
        assert sched.prefix_cache.hits >= len(prompts)
    finally:
        sched.stop()


def test_n_choices_admitted_together_share_the_first_ones_prefill(llama: LLM) -> None:
    sched = Scheduler(llama, max_batch=4, prefix_cache_mb=16, prefix_block_tokens=8)
    try:
        p = _chat(llama, "Hello")
        jobs = [(Job(p, 8, GREEDY, (), True, c), c) for c in [Collector() for _ in range(3)]]
        sched.submit_all([j for j, _ in jobs])  # one request's n=3 choices
        want = _want(llama, p, 8)
        assert [list(c.result().token_ids) for _, c in jobs] == [want] * 3
        assert sched.prefix_cache.hits == 2 and sched.prefix_cache.misses == 1
    finally:
        sched.stop()


def test_eviction_under_a_tiny_budget(llama: LLM) -> None:
    cfg = llama.config
    block_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * 8 * cfg.head_dim * 4
    sched = Scheduler(llama, max_batch=2, prefix_cache_mb=5 * block_bytes / (1 << 20), prefix_block_tokens=8)
    try:
        prompts = [_chat(llama, u, f"System prompt number {i}: " + SYSTEM) for i, u in enumerate(USERS)]
        for _ in range(2):
            assert [_run(sched, [p])[0] for p in prompts] == [_want(llama, p) for p in prompts]
        pc = sched.prefix_cache
        assert pc.evictions > 0
        assert 0 < pc.bytes_held <= pc.budget_bytes
        assert len(pc) <= 5
    finally:
        sched.stop()


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_sliding_window_models(make_ckpt: Callable[[str], Path], arch: str) -> None:
    llm = LLM.from_pretrained(make_ckpt(arch), device="cpu")
    assert llm.config.sliding_window == 8  # prompts here are many windows long
    sched = Scheduler(llm, max_batch=3, prefix_cache_mb=16, prefix_block_tokens=4)
    try:
        prompts = [_chat(llm, u) for u in USERS[:4]]
        got = _run(sched, prompts[:1]) + _run(sched, prompts[1:])
        assert got == [_want(llm, p) for p in prompts]
        assert sched.prefix_cache.tokens_reused >= 3 * 40
    finally:
        sched.stop()


def test_length_dependent_rope_turns_the_cache_off(make_ckpt: Callable[[str], Path]) -> None:
    llm = LLM.from_pretrained(make_ckpt("phi3-longrope"), device="cpu")
    sched = Scheduler(llm, max_batch=2, prefix_cache_mb=16, prefix_block_tokens=4)
    try:
        assert sched.prefix_cache_blocker is not None and "longrope" in sched.prefix_cache_blocker
        assert not sched.prefix_cache.enabled
        p = _chat(llm, "Hello")
        assert _run(sched, [p, p]) == [_want(llm, p)] * 2
        assert sched.prefix_cache.stats()["hits"] == 0 and len(sched.prefix_cache) == 0
    finally:
        sched.stop()
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        Scheduler(llm, prefix_cache_mb=-1)


def test_echo_with_logprobs_runs_the_whole_prompt(llama: LLM) -> None:
    sched = Scheduler(llama, max_batch=2, prefix_cache_mb=16, prefix_block_tokens=8)
    try:
        p = _chat(llama, "Hello")
        _run(sched, [p])
        c = Collector()
        sched.submit(Job(p, 0, GREEDY, (), True, c, logprobs=0, prompt_logprobs=True))
        entries = c.result().prompt_logprobs
        assert entries is not None and len(entries) == len(p) - 1  # every prompt position was scored
        assert sched.prefix_cache.hits == 0  # the echo request did not look the cache up
    finally:
        sched.stop()


# -- through HTTP and the openai client -----------------------------------------------------


def test_openai_client_shared_system_prompt_and_metrics(llama: LLM) -> None:
    settings = ServeSettings(model_name="tiny", max_batch=4, prefix_cache_mb=16, prefix_block_tokens=8)
    with BackgroundServer(llama, settings) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        for u in USERS[:4]:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": u}]
            r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
            want = llama.generate(messages, max_new_tokens=8)
            assert not isinstance(want, list)
            assert r.choices[0].message.content == want.text
            assert r.usage is not None and r.usage.prompt_tokens == len(want.prompt_token_ids)
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        values = {
            line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines() if not line.startswith("#")
        }
        assert values["tb_llm_prefix_cache_hits_total"] >= 3
        assert values["tb_llm_prefix_cache_reused_tokens_total"] >= 3 * 32
        assert values["tb_llm_prefix_cache_misses_total"] >= 1
        assert values["tb_llm_prefix_cache_evictions_total"] == 0
        assert 0 < values["tb_llm_prefix_cache_bytes"] <= values["tb_llm_prefix_cache_budget_bytes"] == 16 << 20
        assert "# TYPE tb_llm_prefix_cache_hits_total counter" in metrics
        health = httpx.get(srv.url + "/health", timeout=10).json()
        assert health["prefix_cache"]["hits"] == values["tb_llm_prefix_cache_hits_total"]
        info = srv.openai_server.info()
        assert info["prefix_cache"]["enabled"] and info["quant"] == llama.quant


# -- the plain LLM.generate / stream path ---------------------------------------------------


def test_generate_and_stream_reuse_a_repeated_system_prompt(llama_dir: Path, llama: LLM) -> None:
    cached = LLM.from_pretrained(llama_dir, device="cpu", prefix_cache_mb=16)
    assert cached.prefix_cache is not None and cached.prefix_cache.block_tokens == 32
    cached.enable_prefix_cache(16, block_tokens=8)
    for u in USERS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": u}]
        got, want = cached.generate(messages, max_new_tokens=10), llama.generate(messages, max_new_tokens=10)
        assert not isinstance(got, list) and not isinstance(want, list)
        assert got.token_ids == want.token_ids and got.text == want.text
    info = cached.info()["prefix_cache"]
    assert info["hits"] == len(USERS) - 1 and info["tokens_reused"] >= (len(USERS) - 1) * 40
    # a later call's timing counts only what it prefilled
    g = cached.generate(_chat(llama, "Hello"), max_new_tokens=4)
    assert not isinstance(g, list) and g.timing.prefill_tokens < len(g.prompt_token_ids) - 32
    # stream: the same text, and its prompt + completion is the next call's prefix
    p = _chat(llama, "Stream this")
    result: list = []  # type: ignore[type-arg]
    text = "".join(cached.stream(p, max_new_tokens=12, result=result))
    assert text == llama.generate(p, max_new_tokens=12).text  # type: ignore[union-attr]
    turn2 = p + result[0].token_ids + llama.encode("more")[1:]
    before = cached.prefix_cache.tokens_reused  # type: ignore[union-attr]
    assert cached.generate(turn2, max_new_tokens=6).token_ids == _want(llama, turn2, 6)  # type: ignore[union-attr]
    assert cached.prefix_cache.tokens_reused - before > len(p)  # type: ignore[union-attr]
    # batches and n > 1 do not touch the cache, and match the plain model
    hits = cached.prefix_cache.hits  # type: ignore[union-attr]
    prompts = [_chat(llama, u) for u in USERS[:2]]
    assert [g.token_ids for g in cached.generate(prompts, max_new_tokens=5)] == [  # type: ignore[union-attr]
        g.token_ids
        for g in llama.generate(prompts, max_new_tokens=5)  # type: ignore[union-attr]
    ]
    assert cached.prefix_cache.hits == hits  # type: ignore[union-attr]
    cached.enable_prefix_cache(0)
    assert cached.prefix_cache is None and "prefix_cache" not in cached.info()
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        cached.enable_prefix_cache(-1)


def test_generate_prefix_cache_refused_for_longrope(make_ckpt: Callable[[str], Path]) -> None:
    with pytest.raises(ValueError, match="longrope"):
        LLM.from_pretrained(make_ckpt("phi3-longrope"), device="cpu", prefix_cache_mb=8)
