"""Bad GGUF files: a clear tb_llm error naming the file and the problem, never a crash or a hang."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import write_gguf_from_folder

from tb_llm import LLM, CheckpointError, LLMError, UnsupportedModelError

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def good(make_ckpt: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf_from_folder(make_ckpt("llama"), tmp_path_factory.mktemp("gguf") / "good.gguf")


def load(path: Path) -> LLM:
    return LLM.from_pretrained(path, device="cpu", engine="reference")


def cut(good: Path, tmp_path: Path, keep: int) -> Path:
    out = tmp_path / "cut.gguf"
    out.write_bytes(good.read_bytes()[:keep])
    return out


def test_good_file_loads(good: Path) -> None:
    assert load(good).info()["format"] == "gguf"


def test_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 not a gguf at all" * 4)
    with pytest.raises(CheckpointError, match=r"model\.gguf: not a GGUF file \(starts with b'PK"):
        load(p)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        load(tmp_path / "empty.gguf")


def test_unsupported_version(good: Path, tmp_path: Path) -> None:
    data = bytearray(good.read_bytes())
    data[4:8] = struct.pack("<I", 7)
    p = tmp_path / "v7.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=r"GGUF version 7 is not supported \(tb-llm reads GGUF versions 2 and 3\)"
    ):
        load(p)


def test_truncated_header(good: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"truncated: 12 bytes is too short for the 24-byte GGUF header"):
        load(cut(good, tmp_path, 12))


def test_truncated_metadata(good: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"cut\.gguf: truncated: the file ends inside metadata entry \d+ of \d+"):
        load(cut(good, tmp_path, 300))


def test_truncated_tensor_index(good: Path, tmp_path: Path) -> None:
    reader = gguf.GGUFReader(good)
    index_start = min(t.field.offset for t in reader.tensors)
    with pytest.raises(CheckpointError, match=r"truncated: the file ends inside the tensor index \(tensor 0 of \d+\)"):
        load(cut(good, tmp_path, index_start + 5))


def test_tensor_data_past_end(good: Path, tmp_path: Path) -> None:
    size = good.stat().st_size
    with pytest.raises(
        CheckpointError, match=r"truncated: tensor '.*' data ends at byte \d+, past the end of the file"
    ):
        load(cut(good, tmp_path, size - 100))


def test_every_truncation_is_a_clear_error(good: Path, tmp_path: Path) -> None:
    size = good.stat().st_size
    for keep in np.linspace(0, size - 1, 40).astype(int):
        with pytest.raises(CheckpointError, match=r"cut\.gguf: (truncated|not a GGUF|corrupt)"):
            load(cut(good, tmp_path, int(keep)))


def test_shape_inconsistent_with_config(make_ckpt: Callable[..., Path], tmp_path: Path) -> None:
    folder = make_ckpt("llama")
    p = write_gguf_from_folder(
        folder, tmp_path / "m.gguf", shapes={"model.layers.1.mlp.down_proj.weight": np.zeros((64, 96), np.float32)}
    )
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'blk\.1\.ffn_down\.weight' \(F32, read as 'model\.layers\.1\.mlp\.down_proj\.weight'\) has shape \[64, 96\], but the metadata implies \[64, 128\]",
    ):
        load(p)
    p = write_gguf_from_folder(folder, tmp_path / "n.gguf", metadata={"llama.feed_forward_length": 96})
    with pytest.raises(CheckpointError, match=r"has shape \[128, 64\], but the metadata implies \[96, 64\]"):
        load(p)


def test_missing_tensor(make_ckpt: Callable[..., Path], tmp_path: Path) -> None:
    p = write_gguf_from_folder(
        make_ckpt("llama"), tmp_path / "m.gguf", skip=("model.layers.0.self_attn.v_proj.weight",)
    )
    with pytest.raises(
        CheckpointError,
        match=r"implies tensor 'model\.layers\.0\.self_attn\.v_proj\.weight' \[32, 64\], but the file has no such tensor",
    ):
        load(p)


def test_missing_metadata(make_ckpt: Callable[..., Path], tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(p, "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"metadata key 'llama\.embedding_length' is missing"):
        load(p)


def test_unsupported_tensor_type(make_ckpt: Callable[..., Path], tmp_path: Path) -> None:
    folder = make_ckpt("llama")
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'blk\.\d\.\w+\.weight' has GGML type Q5_0, which tb-llm does not read \(supported: F32, F16, BF16, Q4_0",
    ):
        load(write_gguf_from_folder(folder, tmp_path / "m.gguf", linear_type="Q5_0"))


def test_unknown_tensor_type_id(good: Path, tmp_path: Path) -> None:
    reader = gguf.GGUFReader(good)
    t = reader.tensors[0]
    type_at = int(t.field.offset) + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape)
    data = bytearray(good.read_bytes())
    data[type_at : type_at + 4] = struct.pack("<I", 250)
    p = tmp_path / "t.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"tensor '{t.name}' has unknown GGML type id 250"):
        load(p)


def test_unknown_architecture(make_ckpt: Callable[..., Path], tmp_path: Path) -> None:
    p = write_gguf_from_folder(make_ckpt("llama"), tmp_path / "m.gguf", metadata={"general.architecture": "mamba"})
    with pytest.raises(
        UnsupportedModelError, match=r"GGUF architecture 'mamba' is not supported; tb-llm reads gemma, gemma2, llama"
    ):
        load(p)


def test_missing_file_and_gguf_file_errors(good: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nope\.gguf: file not found"):
        load(tmp_path / "nope.gguf")
    with pytest.raises(CheckpointError, match=r"other\.gguf: file not found \(named by gguf_file=\)"):
        LLM.from_pretrained(good.parent, gguf_file="other.gguf", device="cpu")
    with pytest.raises(LLMError, match=r"gguf_file='x\.gguf' names a file inside a folder, but this is a file"):
        LLM.from_pretrained(good, gguf_file="x.gguf", device="cpu")


def test_without_the_gguf_package(good: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    with pytest.raises(
        LLMError, match=r"reading GGUF checkpoints needs the `gguf` package: pip install 'tb-llm\[gguf\]'"
    ):
        load(good)


def test_unsupported_tokenizer_model_loads_without_tokenizer(make_ckpt: Callable[..., Path], tmp_path: Path) -> None:
    p = write_gguf_from_folder(make_ckpt("llama"), tmp_path / "m.gguf", metadata={"tokenizer.ggml.model": "llama"})
    with pytest.warns(UserWarning, match=r"tokenizer\.ggml\.model 'llama' is not supported"):
        llm = load(p)
    assert llm.tokenizer is None and "no tokenizer" in llm.info()["notes"][0]
    assert len(llm.generate([1, 2, 3], max_new_tokens=3).token_ids) == 3  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="prompts must be token ids"):
        llm.generate("text", max_new_tokens=1)
