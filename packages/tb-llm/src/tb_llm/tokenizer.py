"""Tokenizer (``tokenizer.json`` through ``tokenizers``), special tokens, chat template, and
incremental detokenization that never splits a multi-byte UTF-8 character."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tb_llm.errors import ChatTemplateError, CheckpointError


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(path, "not a JSON object")
    return data


class Tokenizer:
    def __init__(self, folder: str | Path, model_config: dict[str, Any] | None = None) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(path, "tokenizer.json not found (tb-llm needs a fast tokenizer file)")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:
            raise CheckpointError(path, f"cannot be loaded by `tokenizers`: {exc}") from None
        cfg = _read_json(folder / "tokenizer_config.json")
        gen = _read_json(folder / "generation_config.json")
        model_config = model_config or {}
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.pad_token = _token_text(cfg.get("pad_token"))
        self.bos_token_id = self._id(self.bos_token)
        if self.bos_token_id is None:
            for src in (gen, model_config):
                if isinstance(src.get("bos_token_id"), int):
                    self.bos_token_id = src["bos_token_id"]
                    break
        eos: list[int] = []
        for src in (gen, model_config):
            value = src.get("eos_token_id")
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, int) and v not in eos:
                    eos.append(v)
        eos_id = self._id(self.eos_token)
        if eos_id is not None and eos_id not in eos:
            eos.append(eos_id)
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        pad = self._id(self.pad_token)
        if pad is None:
            pad = gen.get("pad_token_id", model_config.get("pad_token_id"))
        self.pad_token_id: int = pad if isinstance(pad, int) else (eos[0] if eos else 0)
        self.generation_config = gen
        self.chat_template: ChatTemplate | None = None
        template, source = self._find_template(folder, cfg)
        if template is not None:
            self.chat_template = ChatTemplate(template, source, self.bos_token or "", self.eos_token or "")

    @staticmethod
    def _find_template(folder: Path, cfg: dict[str, Any]) -> tuple[str | None, Path]:
        jinja = folder / "chat_template.jinja"  # transformers >= 4.47 writes it next to the config
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8"), jinja
        source = folder / "tokenizer_config.json"
        tpl = cfg.get("chat_template")
        if isinstance(tpl, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
            tpl = named.get("default") or next(iter(named.values()), None)
        if tpl is not None and not isinstance(tpl, str):
            raise ChatTemplateError(f"{source}: chat_template must be a string or a list of named templates")
        if tpl is None:
            legacy = folder / "chat_template.json"
            data = _read_json(legacy)
            if isinstance(data.get("chat_template"), str):
                return data["chat_template"], legacy
        return tpl, source

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        if self.chat_template is None:
            # No template: plain role-prefixed text keeps chat usable on base models.
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            if add_generation_prompt:
                text += "assistant:"
            return self.encode(text)
        text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text, add_special_tokens=False)


class ChatTemplate:
    """A chat template compiled in Jinja's immutable sandbox (templates come from the Hub)."""

    def __init__(self, source: str, path: Path, bos_token: str, eos_token: str) -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.path = path
        self.bos_token, self.eos_token = bos_token, eos_token

        def raise_exception(message: str) -> None:
            raise ChatTemplateError(f"{path}: the chat template refused the conversation: {message}")

        def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
            return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            import datetime

            return datetime.datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"{path}: malformed chat template (line {exc.lineno}): {exc.message}") from None

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        import jinja2

        try:
            return str(
                self._template.render(
                    messages=messages,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                    **extra,
                )
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"{self.path}: chat template failed to render: {exc}") from None


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas.

    Byte-level tokenizers can split one character over several tokens; decoding such a prefix
    yields U+FFFD. A delta is released only once the decoded text no longer ends in U+FFFD, so
    every delta is whole characters and the deltas join to the full decode.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # tokens before this index are already released and never re-decoded
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self.tok.decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        new_text = self.tok.decode(self.ids[self.prefix_offset :], self.skip)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        prefix_text = self.tok.decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        new_text = self.tok.decode(self.ids[self.prefix_offset :], self.skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]
