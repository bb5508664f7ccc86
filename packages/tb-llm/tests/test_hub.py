"""A local HF cache laid out as the Hub lays it, loaded by repo id with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, warnings
warnings.simplefilter("ignore")
from tb_llm import LLM, LLMError
for arg in sys.argv[1:]:
    repo, _, revision = arg.partition("@")
    try:
        llm = LLM.from_pretrained(repo, device="cpu", revision=revision or None)
    except LLMError as exc:
        print(arg, "ERROR", exc)
        continue
    print(arg, "PATH", llm.path)
    print(arg, "TOKENS", llm.generate("Hello", max_new_tokens=5, ignore_eos=True).token_ids)
"""


def _hub_cache(src: Path, cache: Path, repo: str) -> str:
    """Blobs named by hash, snapshot entries as symlinks to them, refs/main -> commit."""
    commit = hashlib.sha1(repo.encode()).hexdigest()
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for f in src.iterdir():
        data = f.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    # A pickle in the repo is never touched: it is not even a valid pickle.
    (snap / "pytorch_model.bin").write_bytes(b"not a pickle")
    return commit


def _run(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_HOME": str(cache.parent / "hf_home")}
    env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=240)


def test_offline_hub_cache(llama_dir: Path, llama, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    commit = _hub_cache(llama_dir, cache, "tiny-org/tiny-llama")
    want = llama.generate("Hello", max_new_tokens=5, ignore_eos=True).token_ids
    # One process for three cases: by branch, by commit hash, and a repo absent from the cache.
    out = _run(cache, "tiny-org/tiny-llama", f"tiny-org/tiny-llama@{commit}", "tiny-org/absent")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout
    assert f"tiny-org/tiny-llama PATH {cache}" in lines and f"snapshots/{commit}" in lines
    assert f"tiny-org/tiny-llama TOKENS {want}" in lines
    assert f"tiny-org/tiny-llama@{commit} TOKENS {want}" in lines
    absent = next(line for line in lines.splitlines() if line.startswith("tiny-org/absent"))
    assert "ERROR" in absent and "HF_HUB_OFFLINE" in absent
