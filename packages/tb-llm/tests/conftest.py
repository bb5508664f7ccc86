from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message=".*torchburn skipped.*")


@pytest.fixture(scope="session")
def make_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Build (once per session and arch) a tiny random checkpoint folder."""
    from tb_llm.testing import make_checkpoint

    built: dict[str, Path] = {}

    def make(arch: str = "llama") -> Path:
        if arch not in built:
            built[arch] = make_checkpoint(arch, tmp_path_factory.mktemp(arch) / "model")
        return built[arch]

    return make


@pytest.fixture(scope="session")
def llama_dir(make_ckpt: Callable[..., Path]) -> Path:
    return make_ckpt("llama")


@pytest.fixture(scope="session")
def llama(llama_dir: Path):  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    return LLM.from_pretrained(llama_dir, device="cpu")


def copy_checkpoint(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst
