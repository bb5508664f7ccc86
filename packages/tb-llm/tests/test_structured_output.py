"""Structured output (``generate(json_schema=...)``, the server's ``response_format``).

The mask itself is checked bit by bit against llguidance's own bitmask on a tiny random-weight
model (whose unconstrained output is noise, so every valid JSON it emits is the grammar's doing);
SmolLM2-135M-Instruct (GGUF) must produce JSON that parses and validates for every schema,
greedy and sampled, and through the server with the real ``openai`` client.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import torch

from tb_llm import LLM
from tb_llm.llm import Generation
from tb_llm.serve import BackgroundServer, ServeSettings
from tb_llm.serve.row_sampler import RequestSampling
from tb_llm.serve.scheduler import Delta, Event, Failed, Finished, Job, Scheduler
from tb_llm.structured import (
    Constraint,
    Grammar,
    StructuredOutputError,
    compile_schema,
    constraint_for,
    grammar_tokenizer,
)
from tb_llm.testing import json_schemas

SCHEMAS = json_schemas()
ANY_OBJECT = {"type": "object"}


def one(llm: LLM, prompt: Any, **kw: Any) -> Generation:
    g = llm.generate(prompt, **kw)
    assert isinstance(g, Generation)
    return g


def check_valid(text: str, schema: Any) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, ANY_OBJECT if schema is True else schema)
    return value


def ref_allowed(bitmask: bytes, vocab: int) -> list[bool]:
    """llguidance's bitmask read word by word with Python ints (independent of structured.py's unpacking)."""
    out = []
    for i in range(vocab):
        word = (
            int.from_bytes(bitmask[4 * (i // 32) : 4 * (i // 32) + 4], "little") if 4 * (i // 32) < len(bitmask) else 0
        )
        out.append(bool((word >> (i % 32)) & 1))
    return out


# -- schemas ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"type": "foo"}, "Invalid type: foo"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "Unsatisfiable"),
        ({"type": "string", "pattern": "(("}, "regex parse error"),
        ({"$ref": "#/definitions/missing"}, "does not exist"),
        ({"type": "string", "format": "no-such-format"}, "Unknown format"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (42, "json_schema must be True"),
        (["type", "object"], "json_schema must be True"),
    ],
)
def test_bad_schemas_name_the_problem(spec: Any, match: str) -> None:
    with pytest.raises(StructuredOutputError, match=match):
        compile_schema(spec)
    assert issubclass(StructuredOutputError, ValueError)


def test_json_object_spellings() -> None:
    assert compile_schema(True).any_object and compile_schema("json_object").any_object
    assert compile_schema('{"type": "object"}').any_object
    assert not compile_schema({"type": "array"}).any_object


# -- the mask on a tiny random-weight model --------------------------------------------------
def test_mask_equals_llguidance_bitmask(llama: LLM) -> None:
    """Every step: the masked logits equal the raw ones where llguidance's bitmask allows the token
    and -inf elsewhere, on all three paths (1-D float32 numpy, [B, V] float64, a strided view)."""
    vocab = llama.config.vocab_size
    schema = SCHEMAS["nested"][1]
    c = constraint_for(llama.tokenizer, vocab, llama.eos_token_ids, schema)
    twin = constraint_for(llama.tokenizer, vocab, llama.eos_token_ids, schema)  # its bitmask, read raw
    gen = torch.Generator().manual_seed(0)
    ids: list[int] = []
    while not c.done:
        allowed = torch.tensor(ref_allowed(twin.matcher.compute_bitmask(), vocab))
        assert allowed.any()
        raw = torch.randn(vocab, generator=gen)
        raw[0], raw[1] = float("nan"), float("inf")  # non-finite logits are masked like any other
        want = torch.where(allowed, raw, torch.tensor(float("-inf")))
        torch.testing.assert_close(c.mask(raw.clone()), want, equal_nan=True, rtol=0, atol=0)
        rows = raw.double().repeat(2, 1)
        torch.testing.assert_close(c.mask(rows), want.double().repeat(2, 1), equal_nan=True, rtol=0, atol=0)
        strided = torch.stack([raw, raw], dim=1)[:, 0]
        assert not strided.is_contiguous()
        torch.testing.assert_close(c.mask(strided), want, equal_nan=True, rtol=0, atol=0)
        ok = torch.nonzero(allowed).flatten()
        tok = int(ok[torch.randint(len(ok), (1,), generator=gen)])
        c.advance(tok)
        twin.advance(tok)
        ids.append(tok)
        assert len(ids) < 400
    assert llama.tokenizer is not None
    check_valid(llama.tokenizer.decode(ids), schema)


def test_mask_size_one_and_empty_rows(llama: LLM) -> None:
    vocab = llama.config.vocab_size
    c = constraint_for(llama.tokenizer, vocab, llama.eos_token_ids, {"type": "boolean"})
    for wrong in (torch.zeros(1), torch.zeros(vocab + 1), torch.tensor(0.0)):  # refused, never mis-masked
        with pytest.raises(ValueError, match="vocabulary"):
            c.mask(wrong)
    one = c.mask(torch.zeros(1, vocab))  # a batch of one
    allowed = torch.tensor(ref_allowed(c.matcher.compute_bitmask(), vocab))
    assert allowed.any() and not allowed.all()
    assert torch.equal(torch.isfinite(one[0]), allowed)
    empty = torch.zeros(0, vocab)
    assert c.mask(empty).shape == (0, vocab)


def test_eos_only_once_the_value_is_complete(llama: LLM) -> None:
    vocab = llama.config.vocab_size
    assert llama.tokenizer is not None and llama.eos_token_ids
    c = constraint_for(llama.tokenizer, vocab, llama.eos_token_ids, {"type": "boolean"})
    row = c.mask(torch.zeros(vocab))
    assert all(row[e] == float("-inf") for e in llama.eos_token_ids) and not c.done
    for tok in llama.tokenizer.encode("true", add_special_tokens=False):
        assert not c.done
        assert torch.isfinite(c.mask(torch.zeros(vocab))[tok])
        c.advance(tok)
    assert c.done  # nothing but EOS can follow: generation stops here
    row = c.mask(torch.zeros(vocab))
    assert set(torch.nonzero(torch.isfinite(row)).flatten().tolist()) <= set(llama.eos_token_ids)


def test_disallowed_token_raises(llama: LLM) -> None:
    vocab = llama.config.vocab_size
    c = constraint_for(llama.tokenizer, vocab, llama.eos_token_ids, {"type": "boolean"})
    assert llama.tokenizer is not None
    bad = llama.tokenizer.encode("{", add_special_tokens=False)[0]
    with pytest.raises(StructuredOutputError, match=r"not allowed|failed"):
        c.advance(bad)


def test_no_tokenizer_is_a_clear_error() -> None:
    with pytest.raises(StructuredOutputError, match="tokenizer"):
        grammar_tokenizer(None, 10, (1,))


@pytest.mark.parametrize("name", ["typed_object", "enum", "array_of_objects", "nested", "number_ranges"])
def test_tiny_model_emits_valid_json(llama: LLM, name: str) -> None:
    """Random weights: the JSON is valid only because every step was masked (a random model never
    ends a free-length decimal fraction, so its ``number`` field is an integer range here)."""
    _, schema = SCHEMAS[name]
    if name == "number_ranges":
        schema = json.loads(json.dumps(schema).replace('"number"', '"integer"'))
    greedy = one(llama, "data:", max_new_tokens=300, json_schema=schema)
    assert greedy.finish_reason == "stop", greedy.text
    check_valid(greedy.text, schema)
    sampled = one(llama, "data:", max_new_tokens=300, json_schema=schema, temperature=1.0, top_p=0.95, seed=7)
    assert sampled.finish_reason == "stop", sampled.text
    check_valid(sampled.text, schema)
    again = one(llama, "data:", max_new_tokens=300, json_schema=schema, temperature=1.0, top_p=0.95, seed=7)
    assert again.token_ids == sampled.token_ids
    result: list[Any] = []
    assert "".join(llama.stream("data:", max_new_tokens=300, json_schema=schema, result=result)) == greedy.text
    assert result[0].token_ids == greedy.token_ids


def test_tiny_model_batch_n_and_logprobs(llama: LLM) -> None:
    schema = SCHEMAS["enum"][1]
    outs = llama.generate("x", n=3, seed=1, temperature=1.0, max_new_tokens=60, json_schema=schema)
    assert isinstance(outs, list) and len(outs) == 3
    for g in outs:
        check_valid(g.text, schema)
    batch = llama.generate(["a", "bb b"], max_new_tokens=60, json_schema=schema)  # type: ignore[arg-type]
    assert isinstance(batch, list)
    for g in batch:
        check_valid(g.text, schema)
    # log-probs stay the model's: the masked-out alternatives still show up
    g = one(llama, "x", max_new_tokens=60, json_schema=schema, logprobs=3)
    assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
    plain = one(llama, "x", max_new_tokens=1, logprobs=3)
    assert plain.logprobs is not None
    assert [t.token for t in g.logprobs[0].top] == [t.token for t in plain.logprobs[0].top]


def test_generate_without_schema_unchanged(llama: LLM) -> None:
    a = one(llama, "hello", max_new_tokens=12, ignore_eos=True)
    b = one(llama, "hello", max_new_tokens=12, ignore_eos=True, json_schema=None)
    assert a.token_ids == b.token_ids


def test_generate_bad_schema(llama: LLM) -> None:
    with pytest.raises(StructuredOutputError, match="Invalid type"):
        llama.generate("x", json_schema={"type": "nope"})


# -- SmolLM2-135M-Instruct ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> LLM:
    return LLM.from_pretrained(smollm2_gguf, device="cpu")


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_smollm2_valid_greedy_and_sampled(smollm2: LLM, name: str) -> None:
    prompt, schema = SCHEMAS[name]
    msgs = [{"role": "user", "content": prompt}]
    settings: list[dict[str, Any]] = [
        {},
        {"temperature": 0.8, "seed": 3},
        {"temperature": 1.0, "top_k": 40, "seed": 11},
    ]
    for kw in settings:
        g = one(smollm2, msgs, max_new_tokens=120, json_schema=schema, **kw)
        assert g.finish_reason == "stop", (kw, g.text)
        check_valid(g.text, schema)


@pytest.fixture(scope="module")
def client(smollm2: LLM) -> Iterator[openai.OpenAI]:
    with BackgroundServer(smollm2, ServeSettings(model_name="smol", max_batch=4, max_queue=8)) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _json_schema(schema: dict[str, Any], strict: bool = True) -> Any:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}


def test_server_json_schema_chat(smollm2: LLM, client: openai.OpenAI) -> None:
    for name in ("typed_object", "array_of_objects", "number_ranges"):
        prompt, schema = SCHEMAS[name]
        msgs: Any = [{"role": "user", "content": prompt}]
        r = client.chat.completions.create(
            model="smol",
            messages=msgs,
            max_tokens=120,
            temperature=0,
            response_format=_json_schema(schema),
        )
        text = r.choices[0].message.content or ""
        assert r.choices[0].finish_reason == "stop"
        check_valid(text, schema)
        assert text == one(smollm2, msgs, max_new_tokens=120, json_schema=schema).text
        # streaming: the same text, piece by piece
        parts = []
        for chunk in client.chat.completions.create(
            model="smol",
            messages=msgs,
            max_tokens=120,
            temperature=0,
            stream=True,
            response_format=_json_schema(schema),
        ):
            parts += [c.delta.content or "" for c in chunk.choices]
        assert "".join(parts) == text


def test_server_sampled_n_and_json_object(client: openai.OpenAI) -> None:
    prompt, schema = SCHEMAS["nested"]
    msgs: Any = [{"role": "user", "content": prompt}]
    r = client.chat.completions.create(
        model="smol",
        messages=msgs,
        max_tokens=120,
        temperature=0.9,
        seed=5,
        n=3,
        response_format=_json_schema(schema),
    )
    for c in r.choices:
        check_valid(c.message.content or "", schema)
    obj = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": SCHEMAS["json_object"][0]}],
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(check_valid(obj.choices[0].message.content or "", True), dict)
    comp = client.completions.create(
        model="smol",
        prompt="A JSON object describing a cat:",
        max_tokens=120,
        temperature=0,
        extra_body={"response_format": _json_schema(SCHEMAS["enum"][1])},
    )
    check_valid(comp.choices[0].text, SCHEMAS["enum"][1])
    text = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=4, response_format={"type": "text"}
    )
    assert text.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("fmt", "param", "match"),
    [
        (_json_schema({"type": "nope"}), "response_format.json_schema.schema", "Invalid type: nope"),
        (_json_schema({"type": "string", "pattern": "(("}), "response_format.json_schema.schema", "regex"),
        (
            {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
            "response_format.json_schema.name",
            "name",
        ),
        ({"type": "json_schema"}, "response_format.json_schema", "json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}},
            "response_format.json_schema.schema",
            "JSON schema object",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": "yes"}},
            "response_format.json_schema.strict",
            "boolean",
        ),
        ({"type": "xml"}, "response_format.type", "'xml'"),
        ("json", "response_format", "must be an object"),
    ],
)
def test_server_bad_response_format_is_400(client: openai.OpenAI, fmt: Any, param: str, match: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=4, response_format=fmt
        )
    assert e.value.status_code == 400
    body: Any = e.value.body
    assert body["param"] == param
    assert match in body["message"]


# -- the scheduler: one grammar per row ---------------------------------------------------------
class _Collector:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.finished = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, (Finished, Failed)):
            self.finished.set()

    def last(self) -> Event:
        assert self.finished.wait(120), "job did not finish"
        return self.events[-1]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Delta))


def _grammar_job(llama: LLM, prompt: str, schema: Any, sampling: RequestSampling) -> tuple[Job, _Collector]:
    gt = grammar_tokenizer(llama.tokenizer, llama.config.vocab_size, llama.eos_token_ids)
    s = dataclasses.replace(sampling, grammar=Grammar(gt, compile_schema(schema)) if schema is not None else None)
    c = _Collector()
    return Job(llama.encode(prompt), 200, s, (), schema is None, c), c


def test_scheduler_rows_follow_their_own_grammar(llama: LLM) -> None:
    enum, nested = SCHEMAS["enum"][1], SCHEMAS["nested"][1]
    greedy, sampled = RequestSampling(temperature=0.0), RequestSampling(temperature=1.0, seed=4)
    sched = Scheduler(llama, max_batch=4)
    try:
        jobs = [
            _grammar_job(llama, "a", enum, greedy),
            _grammar_job(llama, "bb", nested, sampled),
            _grammar_job(llama, "ccc", None, greedy),  # a plain row in the same batch
        ]
        for job, _ in jobs:
            sched.submit(job)
        for (_, c), (prompt, schema, kw) in zip(
            jobs, [("a", enum, {}), ("bb", nested, {"temperature": 1.0, "seed": 4})], strict=False
        ):
            end = c.last()
            assert isinstance(end, Finished) and end.finish_reason == "stop"
            check_valid(c.text, schema)
            assert c.text == one(llama, prompt, max_new_tokens=200, json_schema=schema, **kw).text
        plain = jobs[2][1].last()
        assert isinstance(plain, Finished) and plain.finish_reason == "length"
    finally:
        sched.stop()


def test_scheduler_grammar_failure_ends_only_its_row(llama: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = Constraint.mask

    def failing(self: Constraint, logits: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3:
            raise StructuredOutputError("structured output: no token can continue the JSON (test)")
        return real(self, logits)

    monkeypatch.setattr(Constraint, "mask", failing)
    sched = Scheduler(llama, max_batch=2)
    try:
        bad, bad_c = _grammar_job(llama, "a", SCHEMAS["nested"][1], RequestSampling(temperature=0.0))
        good, good_c = _grammar_job(llama, "b", None, RequestSampling(temperature=0.0))
        good.max_tokens = 30
        sched.submit_all([bad, good])
        end = bad_c.last()
        # the third mask is the second decode step's: the row's own Failed, not a failed prefill or batch
        assert isinstance(end, Failed) and end.message == "structured output: no token can continue the JSON (test)"
        assert len(bad.ids) == 2
        done = good_c.last()
        assert isinstance(done, Finished) and done.completion_tokens == 30
    finally:
        sched.stop()
