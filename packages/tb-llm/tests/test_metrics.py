"""GET /metrics: Prometheus text format, parsed by a small parser written from the format's rules,
and its numbers checked against what the requests did."""

from __future__ import annotations

import itertools
import math
import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from tb_llm import LLM  # noqa: E402
from tb_llm.serve import BackgroundServer, ServeSettings  # noqa: E402

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, dict]:  # type: ignore[type-arg]
    """name -> {"type", "help", "samples": [(sample name, labels, value)]}; raises on any line
    outside the format."""
    families: dict[str, dict] = {}  # type: ignore[type-arg]
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            families.setdefault(name, {"samples": []})["help"] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            fam = families.setdefault(name, {"samples": []})
            assert "type" not in fam and not fam["samples"], f"TYPE after samples: {line}"
            fam["type"] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name, labels, value = m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            found = families.get(name) or families.get(base)
            assert found is not None and "type" in found, f"sample before its TYPE: {line}"
            found["samples"].append((name, labels, value))
    return families


def value(fams: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    fam = fams.get(name) or fams[re.sub(r"_(bucket|sum|count)$", "", name)]
    return sum(v for n, lab, v in fam["samples"] if n == name and all(lab.get(k) == x for k, x in labels.items()))


def check_histogram(fams: dict, name: str) -> int:  # type: ignore[type-arg]
    fam = fams[name]
    assert fam["type"] == "histogram"
    buckets = [(float(lab["le"]), v) for n, lab, v in fam["samples"] if n == name + "_bucket"]
    assert buckets[-1][0] == math.inf
    assert [b for b, _ in buckets] == sorted(b for b, _ in buckets)
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets))  # cumulative
    count = value(fams, name + "_count")
    assert buckets[-1][1] == count
    assert value(fams, name + "_sum") >= 0
    return int(count)


def test_metrics_parse_and_count(llama: LLM) -> None:
    with BackgroundServer(llama, ServeSettings(model_name="m", api_key="k", max_batch=4)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0, timeout=60)
        empty = parse(httpx.get(srv.url + "/metrics").text)
        assert value(empty, "tb_llm_requests_total") == 0
        usages = []
        for prompt in ("Hello", "def main():", "The lazy dog"):
            r = client.completions.create(
                model="m", prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
            )
            usages.append(r.usage)
        r = client.completions.create(
            model="m", prompt="Hi", max_tokens=4, n=2, seed=1, extra_body={"ignore_eos": True}
        )
        usages.append(r.usage)
        res = httpx.get(srv.url + "/metrics")  # no API key needed
        assert res.status_code == 200 and res.headers["content-type"].startswith("text/plain; version=0.0.4")
        fams = parse(res.text)
    assert all("type" in f and "help" in f for f in fams.values())
    assert value(fams, "tb_llm_requests_total") == 4
    assert fams["tb_llm_requests_total"]["type"] == "counter"
    sequences = 5  # three requests, then one with n=2
    assert value(fams, "tb_llm_sequences_finished_total", finish_reason="length") == sequences
    # Each of the n=2 choices prefills its own row.
    assert (
        value(fams, "tb_llm_prompt_tokens_total")
        == sum(u.prompt_tokens for u in usages[:3]) + 2 * usages[3].prompt_tokens
    )
    assert value(fams, "tb_llm_generation_tokens_total") == sum(u.completion_tokens for u in usages) == 3 * 6 + 2 * 4
    assert check_histogram(fams, "tb_llm_time_to_first_token_seconds") == sequences
    assert check_histogram(fams, "tb_llm_inter_token_latency_seconds") == 3 * 5 + 2 * 3
    assert check_histogram(fams, "tb_llm_sequence_duration_seconds") == sequences
    for gauge in (
        "requests_running",
        "requests_waiting",
        "kv_cache_tokens",
        "kv_cache_capacity_tokens",
        "kv_cache_usage_ratio",
    ):
        assert fams["tb_llm_" + gauge]["type"] == "gauge"
    assert value(fams, "tb_llm_requests_waiting") == 0
    assert 0 <= value(fams, "tb_llm_kv_cache_usage_ratio") <= 1
    assert value(fams, "tb_llm_kv_cache_capacity_tokens") > 0
    (info,) = fams["tb_llm_model_info"]["samples"]
    assert info[1] == {"model": "m", "engine": llama.engine, "quant": "fp32"} and info[2] == 1


def test_rejected_requests_are_counted(llama: LLM) -> None:
    with BackgroundServer(llama, ServeSettings(model_name="m", max_batch=1, max_queue=0)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="m", prompt="Hi", n=2, max_tokens=2)
        fams = parse(httpx.get(srv.url + "/metrics").text)
    assert value(fams, "tb_llm_requests_rejected_total") == 1


def test_parser_rejects_malformed_text() -> None:
    with pytest.raises(AssertionError):
        parse("tb_llm_x 1\n")  # a sample before its TYPE
    with pytest.raises(AssertionError):
        parse("# TYPE a counter\na{b=c} 1\n")  # unquoted label value
