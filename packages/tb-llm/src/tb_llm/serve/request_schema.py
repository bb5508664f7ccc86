"""Validation of ``/v1/chat/completions`` and ``/v1/completions`` bodies.

Each field is checked by hand so that every rejection names the offending ``param`` the way
OpenAI's API does. Parameters OpenAI defines but this server does not implement (tools,
``suffix``, ``best_of`` other than ``n``) are refused with a 400, never silently ignored.
``response_format`` takes OpenAI's ``text``, ``json_object`` and ``json_schema`` shapes; a schema
the grammar engine cannot use is a 400 naming the problem.
Extensions other OpenAI-compatible servers accept are honoured: ``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``. tb-llm's own: ``speculative`` (``"ngram"``, an object
``{"method": "ngram", "num_tokens": K, "ngram": N, "min_ngram": M}``, or ``null`` / ``"none"`` to
turn a server default off): prompt-lookup speculative decoding for this request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tb_llm.logprobs import MAX_TOP_LOGPROBS
from tb_llm.serve.api_error import bad_request
from tb_llm.serve.row_sampler import RequestSampling
from tb_llm.speculative import Speculative

if TYPE_CHECKING:
    from tb_llm.structured import Schema

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class GenerationRequest:
    model: str | None
    prompt: Any  # a string, a list of token ids, or chat messages
    chat: bool
    max_tokens: int | None
    sampling: RequestSampling
    stop: list[str]
    stream: bool
    include_usage: bool
    ignore_eos: bool
    prompt_param: str
    n: int = 1
    logprobs: int | None = None  # None: off; k: each token's log-prob and its k likeliest alternatives
    echo: bool = False  # /v1/completions: the prompt (and its log-probs) before the completion
    response_format: Schema | None = None  # json_object / json_schema: the output must match it
    speculative: Speculative | None = None  # prompt lookup asked for by the request
    speculative_given: bool = False  # the request set 'speculative' (null: off, whatever the server's default)


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number, got {value!r}", name)
    ok = (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        raise bad_request(f"'{name}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}", name)
    return float(value)


def _int(body: dict[str, Any], name: str, lo: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {value!r}", name)
    if lo is not None and value < lo:
        raise bad_request(f"'{name}' must be >= {lo}, got {value}", name)
    return value


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean, got {value!r}", name)
    return value


def _seed(body: dict[str, Any]) -> int | None:
    seed = _int(body, "seed")
    # torch generators take 64-bit seeds; any integer maps onto one (non-negative ones unchanged).
    return None if seed is None else seed % (1 << 64)


def _stop(body: dict[str, Any], max_stop: int) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if len(stops) > max_stop:
        raise bad_request(f"'stop' may hold at most {max_stop} strings, got {len(stops)}", "stop")
    return [s for s in stops if s]


def _logit_bias(body: dict[str, Any]) -> dict[int, float]:
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias")
    out: dict[int, float] = {}
    for k, v in value.items():
        try:
            tok = int(k)
        except (TypeError, ValueError):
            raise bad_request(f"'logit_bias' key {k!r} is not a token id", "logit_bias") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad_request(f"'logit_bias' value for {k} must be a number in [-100, 100]", "logit_bias")
        out[tok] = float(v)
    return out


def _n(body: dict[str, Any], max_n: int) -> int:
    n = _int(body, "n", 1)
    if n is None:
        return 1
    if n > max_n:
        raise bad_request(f"'n' must be at most {max_n}, got {n}", "n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise bad_request("best_of is not supported (other than best_of == n)", "best_of")
    return n


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if chat:  # logprobs: bool, top_logprobs: 0..20 alternatives (needs logprobs)
        on = _bool(body, "logprobs")
        top = _int(body, "top_logprobs", 0)
        if top is not None and top > MAX_TOP_LOGPROBS:
            raise bad_request(f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}, got {top}", "top_logprobs")
        if top is not None and not on:
            raise bad_request("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
        return (top or 0) if on else None
    k = _int(body, "logprobs", 0)  # /v1/completions: logprobs is the number of alternatives
    if k is not None and k > MAX_TOP_LOGPROBS:
        raise bad_request(f"'logprobs' must be at most {MAX_TOP_LOGPROBS}, got {k}", "logprobs")
    return k


def _refuse_unsupported(body: dict[str, Any], chat: bool) -> None:
    if chat and body.get("tools"):
        raise bad_request("tools / function calling are not supported by this server", "tools")
    if not chat and body.get("suffix"):
        raise bad_request("suffix is not supported by this server", "suffix")


def _response_format(body: dict[str, Any]) -> Schema | None:
    """OpenAI's ``response_format``: ``{"type": "text"}`` (plain), ``{"type": "json_object"}`` (any
    JSON object) or ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kinds = "'text', 'json_object' or 'json_schema'"
    if not isinstance(fmt, dict):
        raise bad_request(f"'response_format' must be an object with 'type' {kinds}", "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        spec: Any = True
    elif kind == "json_schema":
        js = fmt.get("json_schema")
        where = "response_format.json_schema"
        if not isinstance(js, dict):
            raise bad_request("'response_format.json_schema' must be an object with 'name' and 'schema'", where)
        name = js.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request("'response_format.json_schema.name' must be a non-empty string", f"{where}.name")
        strict = js.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request("'response_format.json_schema.strict' must be a boolean", f"{where}.strict")
        spec = js.get("schema", {})  # OpenAI: a missing schema means any JSON value's schema {}
        if not isinstance(spec, dict):
            raise bad_request("'response_format.json_schema.schema' must be a JSON schema object", f"{where}.schema")
    else:
        raise bad_request(f"'response_format.type' must be {kinds}, got {kind!r}", "response_format.type")
    try:
        from tb_llm.structured import compile_schema

        return compile_schema(spec)
    except (ValueError, ImportError) as exc:  # StructuredOutputError is a ValueError
        param = "response_format.json_schema.schema" if kind == "json_schema" else "response_format"
        raise bad_request(str(exc), param) from None


SPECULATIVE_FIELDS = ("method", "num_tokens", "ngram", "min_ngram")


def _speculative(body: dict[str, Any], draft_tokens: int) -> tuple[Speculative | None, bool]:
    """The ``speculative`` extension -> (the drafting to use or None, whether the request set it)."""
    if "speculative" not in body:
        return None, False
    value = body["speculative"]
    if value is None or value is False or value in ("none", "off"):
        return None, True
    fields: dict[str, Any]
    if isinstance(value, str):
        fields = {"method": value}
    elif isinstance(value, dict):
        fields = dict(value)
        unknown = sorted(set(fields) - set(SPECULATIVE_FIELDS))
        if unknown:
            raise bad_request(
                f"unknown 'speculative' field(s) {', '.join(unknown)}; known: {', '.join(SPECULATIVE_FIELDS)}",
                "speculative",
            )
    else:
        raise bad_request("'speculative' must be 'ngram', an object, or null", "speculative")
    method = fields.setdefault("method", "ngram")
    if method == "prompt_lookup":
        fields["method"] = "ngram"
    elif method != "ngram":
        raise bad_request(
            f"'speculative' method must be 'ngram' (prompt lookup; the server has no draft model), got {method!r}",
            "speculative.method",
        )
    fields.setdefault("num_tokens", draft_tokens)
    try:
        return Speculative(**fields), True
    except ValueError as exc:
        raise bad_request(str(exc), "speculative") from None


def _content(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts can be served
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", f"messages[{i}].role"
            )
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    return out


def _prompt(body: dict[str, Any]) -> Any:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise bad_request("'prompt' is empty", "prompt")
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
        return list(p)
    if isinstance(p, list) and len(p) > 1:
        raise bad_request("only one prompt per request is supported; send several requests instead", "prompt")
    raise bad_request("'prompt' must be a non-empty string or a list of token ids", "prompt")


def parse(body: Any, chat: bool, max_stop: int = 16, max_n: int = 16, draft_tokens: int = 4) -> GenerationRequest:
    """``draft_tokens``: the drafts per step of a ``"speculative": "ngram"`` that names no ``num_tokens``."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    _refuse_unsupported(body, chat)
    prompt: Any = _messages(body) if chat else _prompt(body)
    echo = False if chat else _bool(body, "echo")
    max_tokens = _int(body, "max_completion_tokens", 1) if chat else None
    if max_tokens is None:
        # max_tokens 0 with echo scores the prompt and generates nothing (the usual scoring call).
        max_tokens = _int(body, "max_tokens", 0 if echo else 1)
    top_k = _int(body, "top_k")
    sampling = RequestSampling(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=0 if top_k is None or top_k < 0 else top_k,  # -1 means "off", as in vLLM
        min_p=_number(body, "min_p", 0.0, 0.0, 0.999),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 10.0, lo_open=True),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body),
        seed=_seed(body),
    )
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    include_usage = bool(opts and opts.get("include_usage"))
    speculative, speculative_given = _speculative(body, draft_tokens)
    return GenerationRequest(
        model=model,
        prompt=prompt,
        chat=chat,
        max_tokens=max_tokens,
        sampling=sampling,
        stop=_stop(body, max_stop),
        stream=stream,
        include_usage=include_usage,
        ignore_eos=_bool(body, "ignore_eos"),
        prompt_param="messages" if chat else "prompt",
        n=_n(body, max_n),
        logprobs=_logprobs(body, chat),
        echo=echo,
        response_format=_response_format(body),
        speculative=speculative,
        speculative_given=speculative_given,
    )
