"""Corrupt or mismatched inputs: a clear exception that names the file and the problem."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import copy_checkpoint

from tb_llm import LLM, ChatTemplateError, CheckpointError, UnsupportedModelError
from tb_llm.safetensors_io import CheckpointWeights, save_file


@pytest.fixture
def ckpt(llama_dir: Path, tmp_path: Path) -> Path:
    return copy_checkpoint(llama_dir, tmp_path / "m")


def test_truncated_safetensors(ckpt: Path) -> None:
    st = ckpt / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated"):
        LLM.from_pretrained(ckpt, device="cpu")


def test_header_points_past_file(ckpt: Path) -> None:
    st = ckpt / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[:8] = struct.pack("<Q", len(data) * 4)
    st.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*header length .* past the end"):
        LLM.from_pretrained(ckpt, device="cpu")


def test_tensor_offsets_past_file(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(4, 4)}, path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header["a"]["data_offsets"] = [0, 64]
    header["a"]["shape"] = [4, 4]
    header["a"]["data_offsets"] = [1000, 1064]
    new = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    with pytest.raises(CheckpointError, match=r"x\.safetensors.*tensor 'a'.*past the end"):
        CheckpointWeights(tmp_path)


def test_garbage_header(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        CheckpointWeights(tmp_path)


def test_missing_shard(ckpt: Path) -> None:
    from tb_llm.safetensors_io import SafetensorsFile

    st = SafetensorsFile(ckpt / "model.safetensors")
    names = st.keys()
    half = len(names) // 2
    save_file({n: st.get(n) for n in names[:half]}, ckpt / "model-00001-of-00002.safetensors")
    save_file({n: st.get(n) for n in names[half:]}, ckpt / "model-00002-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {n: f"model-0000{1 if i < half else 2}-of-00002.safetensors" for i, n in enumerate(names)},
    }
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    (ckpt / "model.safetensors").unlink()
    # Sharded loads fine ...
    LLM.from_pretrained(ckpt, device="cpu")
    # ... until a shard goes missing.
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors.*missing"):
        LLM.from_pretrained(ckpt, device="cpu")


def test_config_does_not_match_weights(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors.*gate_proj.*shape \[128, 64\].*config\.json implies \[96, 64\]"
    ):
        LLM.from_pretrained(ckpt, device="cpu")


def test_config_with_more_layers_than_weights(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json.*model\.layers\.2\..*no safetensors file"):
        LLM.from_pretrained(ckpt, device="cpu")


def test_config_with_fewer_layers_than_weights(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"layer 1.*num_hidden_layers=1"):
        LLM.from_pretrained(ckpt, device="cpu")


def test_malformed_chat_template(ckpt: Path) -> None:
    tc = json.loads((ckpt / "tokenizer_config.json").read_text())
    tc["chat_template"] = "{% for m in messages %}{{ m['content'] }"
    (ckpt / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(ChatTemplateError, match=r"tokenizer_config\.json: malformed chat template"):
        LLM.from_pretrained(ckpt, device="cpu")


def test_chat_template_is_sandboxed(ckpt: Path) -> None:
    tc = json.loads((ckpt / "tokenizer_config.json").read_text())
    tc["chat_template"] = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (ckpt / "tokenizer_config.json").write_text(json.dumps(tc))
    llm = LLM.from_pretrained(ckpt, device="cpu")
    with pytest.raises(ChatTemplateError, match="failed to render"):
        llm.generate([{"role": "user", "content": "hi"}], max_new_tokens=1)


def test_unknown_model_type(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        UnsupportedModelError, match=r"'gpt_neox' is not supported.*gemma, gemma2, llama, mistral, phi3, qwen2, qwen3"
    ):
        LLM.from_pretrained(ckpt, device="cpu")


def test_pickle_weights_are_refused(ckpt: Path) -> None:
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*never loads pickle"):
        LLM.from_pretrained(ckpt, device="cpu")


def test_not_a_folder_or_repo(tmp_path: Path) -> None:
    from tb_llm import LLMError

    with pytest.raises(LLMError, match="not a folder"):
        LLM.from_pretrained(str(tmp_path / "nope"), device="cpu")
