"""The seed's examples as a new user runs them: printing a generation, local paths that do not
exist, a fast ``--help`` that lists every command, the chat footer, ``python -m torchburn.llm``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tb_llm import LLM, LLMError, hub
from tb_llm.hub import looks_local, resolve

COMMANDS = ("chat", "generate", "benchmark", "perplexity", "serve")


def test_print_generation_prints_the_text(llama: LLM, capsys: pytest.CaptureFixture[str]) -> None:
    g = llama.generate("Hello", max_new_tokens=6, ignore_eos=True)
    assert not isinstance(g, list) and g.text
    print(g)
    assert capsys.readouterr().out == g.text + "\n"
    assert repr(g).startswith("Generation(") and "token_ids=" in repr(g) and "finish_reason=" in repr(g)


def test_help_is_fast_and_lists_every_command(tmp_path: Path) -> None:
    # -X importtime lists every module imported: torch must not be among them before argparse
    # answers (that import is what took --help seconds).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tb_llm", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    usage = out.stdout.splitlines()[0]
    assert usage.startswith("usage: python -m tb_llm")
    for name in COMMANDS:
        assert name in usage, usage
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "tb_llm.cli" in imported  # the check below looks at the right list
    heavy = {m for m in imported if m.split(".")[0] in ("torch", "numpy", "tokenizers", "starlette", "uvicorn")}
    assert not heavy, sorted(heavy)[:10]


def test_public_names_still_import() -> None:
    import tb_llm

    assert tb_llm.LLM is LLM
    assert issubclass(tb_llm.CheckpointError, tb_llm.LLMError)
    for name in tb_llm.__all__:
        assert getattr(tb_llm, name) is not None
    assert "LLM" in dir(tb_llm)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = tb_llm.nope  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "local"),
    [
        ("Qwen/Qwen2.5-0.5B", False),
        ("gpt2", False),
        ("./qwen", True),
        ("../models/qwen", True),
        ("/abs/qwen", True),
        ("~/qwen", True),
        (".", True),
        ("a/b/c", True),
        ("models/qwen_0_5b", True),  # models/ exists in the test's working folder
        ("nomodels/qwen_0_5b", False),
    ],
)
def test_local_path_rule(name: str, local: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert looks_local(name) is local


def test_missing_relative_folder_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    calls: list[str] = []
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda **kw: calls.append(kw["repo_id"]))
    with pytest.raises(LLMError, match="no such local folder") as e:
        LLM.from_pretrained("models/qwen_0_5b", device="cpu")
    assert str(tmp_path / "models" / "qwen_0_5b") in str(e.value)
    with pytest.raises(LLMError, match="no such local folder"):
        resolve(Path("qwen_0_5b"))  # a Path object is never a repo id
    assert calls == []  # the Hub was never asked


def test_hub_ids_still_go_to_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[str] = []

    def fake_download(**kw: object) -> str:
        calls.append(str(kw["repo_id"]))
        raise OSError("offline")

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_download)
    with pytest.raises(LLMError, match="Hugging Face Hub") as e:
        hub.resolve("Qwen/Qwen2.5-0.5B")
    assert calls == ["Qwen/Qwen2.5-0.5B"]
    # When the Hub fails, the message also says no local folder of that name exists.
    assert f"nor is it a local folder: no {tmp_path / 'Qwen' / 'Qwen2.5-0.5B'}" in str(e.value)


def test_chat_footer_labels_both_rates(llama: LLM) -> None:
    lines = iter(["hi", "/exit"])
    out = io.StringIO()
    llama.chat(max_new_tokens=4, input_fn=lambda _: next(lines), output=out, temperature=0.0)
    footer = out.getvalue().strip().splitlines()[-1]
    assert "tok/s prefill" in footer and "tok/s decode" in footer, footer


def test_python_dash_m_torchburn_llm(llama_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "torchburn.llm", "generate", "-m", str(llama_dir), "-d", "cpu", "-n", "3", "Hello"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.returncode == 0, out.stderr
    assert "3 tokens" in out.stderr
