"""GGUF files written from tiny random checkpoints: every architecture and every tensor type loads
to the same model as the safetensors folder holding what the GGUF tensors decode to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import write_gguf_from_folder

from tb_llm import LLM, LLMError
from tb_llm.gguf import GGUFFile
from tb_llm.gguf.architecture import config_from_metadata, tensor_plan
from tb_llm.gguf.weights import GGUFWeights, bit_equal

pytest.importorskip("gguf")

PROMPT = [1, 17, 42, 99, 5, 250, 7, 31]


def logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    t = torch.tensor([ids])
    pos = torch.arange(len(ids)).unsqueeze(0)
    return llm.model.forward(t, pos, llm.model.new_cache(1, len(ids) + 1), last_only=False)[0]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2"])
def test_every_architecture_matches_its_safetensors(arch: str, make_ckpt: Callable[..., Path], tmp_path: Path) -> None:
    folder = make_ckpt(arch)
    gguf_path = write_gguf_from_folder(folder, tmp_path / f"{arch}.gguf", reference=tmp_path / "ref")
    got = LLM.from_pretrained(gguf_path, device="cpu", engine="reference")
    want = LLM.from_pretrained(tmp_path / "ref", device="cpu", engine="reference")
    assert got.config.model_type == ("llama" if arch == "mistral" else arch)
    torch.testing.assert_close(logits(got, PROMPT), logits(want, PROMPT), rtol=1e-5, atol=1e-5)
    # the tokenizer from the metadata encodes like the folder's tokenizer.json
    for text in ("Hello world! How are you?", "Grüße 🙂 日本語", "  spaces\n\ttabs  ", "<|user|>hi<|end|>"):
        assert got.encode(text) == want.encode(text), text
    chat = [{"role": "user", "content": "Hi there"}]
    assert got.encode(chat) == want.encode(chat)
    assert got.info()["format"] == "gguf" and got.info()["loaded_as"] == {
        "F32": {"kept": got.info()["tensor_types"]["F32"]}
    }


# Hidden 256 so that K-quant rows (256 per super-block) fit every matrix.
KQ = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


@pytest.fixture(scope="session")
def wide_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tb_llm.testing import make_checkpoint

    return make_checkpoint("llama", tmp_path_factory.mktemp("wide") / "model", **KQ)


@pytest.mark.parametrize("type_name", ["F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_every_tensor_type_loads_as_gguf_decodes_it(type_name: str, wide_llama: Path, tmp_path: Path) -> None:
    path = write_gguf_from_folder(wide_llama, tmp_path / "m.gguf", linear_type=type_name, reference=tmp_path / "ref")
    got = LLM.from_pretrained(path, device="cpu", engine="reference")
    want = LLM.from_pretrained(tmp_path / "ref", device="cpu", engine="reference")
    torch.testing.assert_close(logits(got, PROMPT), logits(want, PROMPT), rtol=1e-5, atol=1e-5)
    n_linear = 7 * got.config.num_layers
    info = got.info()
    assert info["tensor_types"][type_name] == n_linear
    assert info["loaded_as"][type_name] == {"converted" if type_name in ("F16", "BF16") else "dequantized": n_linear}


@pytest.mark.parametrize(
    ("type_name", "quant"), [("Q4_0", "int4"), ("Q4_0", "int8"), ("Q4_K", "int4"), ("Q8_0", "bf16"), ("F16", "int8")]
)
def test_quantized_loads_report_what_happened(quant: str, type_name: str, wide_llama: Path, tmp_path: Path) -> None:
    path = write_gguf_from_folder(wide_llama, tmp_path / "m.gguf", linear_type=type_name, reference=tmp_path / "ref")
    got = LLM.from_pretrained(path, device="cpu", engine="reference", quant=quant)
    want = LLM.from_pretrained(tmp_path / "ref", device="cpu", engine="reference", quant=quant)
    n_linear = 7 * got.config.num_layers
    if type_name in ("F16",):
        expect = "converted" if quant == "bf16" else "quantized"
    elif quant == "bf16":
        expect = "dequantized"
    elif quant == "int4" and type_name == "Q4_0":
        expect = "kept"
    else:
        expect = "requantized"
    assert got.info()["loaded_as"][type_name] == {expect: n_linear}
    a, b = logits(got, PROMPT), logits(want, PROMPT)
    if expect == "kept":
        # the kept int4 matrices are the GGUF's weights exactly (test below); the reference folder's
        # int4 requantizes them. Both quantize the embedding / head the same way, so the kept model
        # is at least as close to fp32 as the requantized one.
        exact = logits(LLM.from_pretrained(tmp_path / "ref", device="cpu", engine="reference"), PROMPT)
        assert (a - exact).abs().max() <= (b - exact).abs().max()
    else:
        # requantized from the same floats by the same quantizer: the same model
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_q4_0_kept_blocks_are_bit_exact(wide_llama: Path, tmp_path: Path) -> None:
    path = write_gguf_from_folder(wide_llama, tmp_path / "m.gguf", linear_type="Q4_0")
    f = GGUFFile(path)
    w = GGUFWeights(f, tensor_plan(f, config_from_metadata(f)))
    for name in w:
        if name.endswith("_proj.weight"):
            kept = w.quantized(name, "int4", 32)
            assert kept is not None and kept.group_size == 32, name
            assert bit_equal(kept.dequantize(), w.get(name)), name
            assert w.quantized(name, "int4", 64) is None  # another group size: requantized
            assert w.quantized(name, "int8", 32) is None


def test_folder_with_one_gguf_and_gguf_file(wide_llama: Path, tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.mkdir()
    write_gguf_from_folder(wide_llama, one / "a.gguf", linear_type="Q8_0")
    assert LLM.from_pretrained(one, device="cpu", engine="reference").info()["tensor_types"]["Q8_0"] > 0
    write_gguf_from_folder(wide_llama, one / "b.gguf", linear_type="Q4_0")
    with pytest.raises(LLMError, match=r"2 GGUF files \(a\.gguf, b\.gguf\); choose one with gguf_file="):
        LLM.from_pretrained(one, device="cpu", engine="reference")
    llm = LLM.from_pretrained(one, device="cpu", engine="reference", gguf_file="b.gguf")
    assert "Q4_0" in llm.info()["tensor_types"]


def with_tensor(src: Path, dst: Path, name: str, value: object) -> None:
    """A copy of GGUF file ``src`` with one more F32 tensor (as llama.cpp's converter adds rope_freqs)."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, str(r.fields["general.architecture"].contents()))
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, field.contents())
        else:
            w.add_key_value(key, field.contents(), field.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.add_tensor(name, np.asarray(value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_llama3_rope_freqs_tensor(tmp_path: Path) -> None:
    """Llama 3.1 GGUFs carry RoPE scaling as a `rope_freqs` tensor (divisors of the base
    frequencies); they load as the llama3 RoPE whose divisors they are."""
    import numpy as np
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tb_llm.testing import make_checkpoint

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    folder = make_checkpoint("llama", tmp_path / "ckpt", head_dim=64, num_attention_heads=2, rope_parameters=rope)
    cfg = AutoConfig.from_pretrained(folder)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg)
    base = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    divisors = (base / scaled).numpy().astype(np.float32)
    out = tmp_path / "m.gguf"
    write_gguf_from_folder(folder, out, reference=tmp_path / "ref", metadata={"llama.rope.freq_base": 500000.0})
    with_tensor(out, tmp_path / "r.gguf", "rope_freqs.weight", divisors)
    got = LLM.from_pretrained(tmp_path / "r.gguf", device="cpu", engine="reference")
    assert got.config.rope.rope_type == "llama3" and got.config.rope.factor == 8.0
    want = LLM.from_pretrained(tmp_path / "ref", device="cpu", engine="reference")
    long_prompt = [int(i) % 300 + 7 for i in range(40)]
    torch.testing.assert_close(logits(got, long_prompt), logits(want, long_prompt), rtol=1e-5, atol=1e-5)
    # divisors of no known llama3 setting: an error, not a silently different RoPE
    with_tensor(out, tmp_path / "bad.gguf", "rope_freqs.weight", divisors * 1.5)
    from tb_llm import UnsupportedModelError

    with pytest.raises(
        UnsupportedModelError, match=r"rope_freqs\.weight' holds RoPE frequency factors that match no Llama 3"
    ):
        LLM.from_pretrained(tmp_path / "bad.gguf", device="cpu", engine="reference")
