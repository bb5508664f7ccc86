"""The model set: 10 small real models, inference, torchburn (default engines) against eager and
inductor in one run, at 1 thread and at ``--threads``; contenders interleaved, medians; the
geometric means of the speed-ups over eager; how many ops of each graph ran outside an engine.

    python -m benchmarks.bench_models [--threads 2] [--only mlp,cnn]

Models: an MLP, a CNN with BatchNorm, nn.TransformerEncoderLayer, BERT, GPT-2, Qwen2 and Llama
(transformers, small random configs), a ResNet basic block, a ViT-style patch-embedding model and
a MobileNet-style depthwise (inverted residual) block. ``python -m benchmarks`` renders the
table and the geomeans into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.harness import faults_per_call, interleaved, settle

# -- the models ------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_bn(3, 32, 3), nn.ReLU(), nn.MaxPool2d(2), *_conv_bn(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class ResNetBlock(nn.Module):
    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(c, c, 3), nn.ReLU(), *_conv_bn(c, c, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


class MobileNetBlock(nn.Module):
    """Inverted residual: 1×1 expand, 3×3 depthwise, 1×1 project, ReLU6, residual."""

    def __init__(self, c: int = 32, expand: int = 4) -> None:
        super().__init__()
        h = c * expand
        self.body = nn.Sequential(
            *_conv_bn(c, h, 1), nn.ReLU6(), *_conv_bn(h, h, 3, groups=h), nn.ReLU6(), *_conv_bn(h, c, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class PatchViT(nn.Module):
    """Patch embedding (a stride-8 convolution), class token, 2 encoder layers, a head."""

    def __init__(self, d: int = 128, patch: int = 8, image: int = 64) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(self.encoder(t))[:, 0])


class _Logits(nn.Module):
    """A transformers model returning its logits / last hidden state as one tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _hf(name: str) -> nn.Module:
    import transformers as tf

    small = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000)
    if name == "bert":
        cfg: Any = tf.BertConfig(**small, max_position_embeddings=256, attn_implementation="sdpa")
        return _Logits(tf.BertModel(cfg, add_pooling_layer=False))
    if name == "gpt2":
        cfg = tf.GPT2Config(
            n_embd=256, n_layer=2, n_head=4, vocab_size=1000, n_positions=256, attn_implementation="sdpa"
        )
        return _Logits(tf.GPT2LMHeadModel(cfg))
    if name == "qwen2":
        cfg = tf.Qwen2Config(**small, num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa")
        return _Logits(tf.Qwen2ForCausalLM(cfg))
    cfg = tf.LlamaConfig(**small, num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa")
    return _Logits(tf.LlamaForCausalLM(cfg))


def _eval_bn(model: nn.Module) -> nn.Module:
    """Inference mode with non-trivial running statistics, so folded batch norm is exercised."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def _ids(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, 1000, (batch, seq))


#: name -> (description, builder of (model, inputs))
MODELS: dict[str, tuple[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]]] = {
    "mlp": ("MLP 784-512-256-10, batch 64", lambda: (MLP().eval(), (torch.randn(64, 784),))),
    "cnn": ("CNN conv-BN-ReLU-pool ×2, 3×32×32, batch 16", lambda: (_eval_bn(CNN()), (torch.randn(16, 3, 32, 32),))),
    "transformer_layer": (
        "nn.TransformerEncoderLayer d=256, seq 64, batch 4",
        lambda: (
            nn.TransformerEncoderLayer(256, 4, 512, dropout=0.0, batch_first=True).eval(),
            (torch.randn(4, 64, 256),),
        ),
    ),
    "bert": ("BERT 2 layers d=256, seq 64, batch 4", lambda: (_hf("bert").eval(), (_ids(4, 64),))),
    "gpt2": ("GPT-2 2 layers d=256, seq 64, batch 4", lambda: (_hf("gpt2").eval(), (_ids(4, 64),))),
    "qwen2": ("Qwen2 2 layers d=256, seq 64, batch 4", lambda: (_hf("qwen2").eval(), (_ids(4, 64),))),
    "llama": ("Llama 2 layers d=256, seq 64, batch 4", lambda: (_hf("llama").eval(), (_ids(4, 64),))),
    "resnet_block": (
        "ResNet basic block 64ch, 32×32, batch 8",
        lambda: (_eval_bn(ResNetBlock()), (torch.randn(8, 64, 32, 32),)),
    ),
    "vit": (
        "ViT patch-embed 8×8 + 2 layers d=128, 3×64×64, batch 8",
        lambda: (PatchViT().eval(), (torch.randn(8, 3, 64, 64),)),
    ),
    "mobilenet_block": (
        "MobileNet inverted residual 32→128 depthwise, 32×32, batch 8",
        lambda: (_eval_bn(MobileNetBlock()), (torch.randn(8, 32, 32, 32),)),
    ),
}


# -- measuring ---------------------------------------------------------------------------------


def _coverage(compiled: Callable[[], Any]) -> tuple[int, int, int]:
    """(ops on an engine, ops routed to eager by measurement, fallback ops) of one call."""
    import torchburn

    torchburn.reset_stats()
    compiled()
    cov = torchburn.op_coverage()
    native = sum(cov.get("native", {}).values()) + sum(cov.get("delegated", {}).values())
    return native, sum(cov.get("routed", {}).values()), sum(cov.get("fallback", {}).values())


def _measure(
    key: str, desc: str, model: nn.Module, inputs: tuple[torch.Tensor, ...], counts: list[int], repeats: int
) -> list[dict[str, Any]]:
    import torchburn

    torch._dynamo.reset()
    rows = []
    with torch.no_grad():
        tb = torch.compile(model, backend="torchburn", options={"warn": False})
        ind = torch.compile(model, backend="inductor")
        torch.testing.assert_close(tb(*inputs), model(*inputs), rtol=1e-3, atol=1e-3)  # a wrong answer is no speed-up
        for n in counts:
            torch.set_num_threads(n)
            # routing by measurement decides first (a user's steady state), then coverage is read
            settle(lambda: tb(*inputs))
            native, routed, fallback = _coverage(lambda: tb(*inputs))
            contenders = {
                "eager": lambda: model(*inputs),
                "torchburn": lambda: tb(*inputs),
                "inductor": lambda: ind(*inputs),
            }
            times = interleaved(contenders, repeats=repeats)
            faults = {name: faults_per_call(fn) for name, fn in contenders.items()}
            rows.append(
                {
                    "suite": "models",
                    "model": key,
                    "name": desc,
                    "threads": n,
                    "engines": ",".join(torchburn.active_engines()) or "eager",
                    "eager_s": times["eager"],
                    "torchburn_s": times["torchburn"],
                    "inductor_s": times["inductor"],
                    "notes": f"ops on an engine {native}, routed to eager {routed}, fallback {fallback}; "
                    f"page faults per call: eager {faults['eager']:.0f}, torchburn {faults['torchburn']:.0f}, "
                    f"inductor {faults['inductor']:.0f}",
                }
            )
    return rows


def run(threads: int = 2, only: set[str] | None = None, repeats: int = 7) -> list[dict[str, Any]]:
    import torchburn

    warnings.filterwarnings("ignore", category=torchburn.TorchburnFallbackWarning)
    rows = []
    counts = sorted({1, threads})
    for key, (desc, build) in MODELS.items():
        if only and key not in only:
            continue
        torch.manual_seed(0)
        model, inputs = build()
        rows += _measure(key, desc, model, inputs, counts, repeats)
    torch.set_num_threads(threads)
    return rows


def geomeans(rows: list[dict[str, Any]]) -> dict[int, tuple[float, float, int]]:
    """threads -> (torchburn geomean speed-up, inductor geomean speed-up, models)."""
    out = {}
    for n in sorted({r["threads"] for r in rows}):
        sel = [r for r in rows if r["threads"] == n]
        tb = math.exp(statistics.fmean(math.log(r["eager_s"] / r["torchburn_s"]) for r in sel))
        ind = math.exp(statistics.fmean(math.log(r["eager_s"] / r["inductor_s"]) for r in sel))
        out[n] = (tb, ind, len(sel))
    return out


def render(rows: list[dict[str, Any]]) -> list[str]:
    """The model-set section of docs/benchmarks.md: geomeans per thread count, models below 1.0×."""
    lines = ["", "## Model set (inference): geometric means", ""]
    lines += ["| threads | models | torchburn vs eager | inductor vs eager | torchburn ÷ inductor | below 1.0× eager |"]
    lines += ["| --- | --- | --- | --- | --- | --- |"]
    for n, (tb, ind, count) in geomeans(rows).items():
        slow = [r["model"] for r in rows if r["threads"] == n and r["eager_s"] < r["torchburn_s"]]
        lines.append(f"| {n} | {count} | {tb:.2f}× | {ind:.2f}× | {tb / ind:.2f} | {', '.join(slow) or 'none'} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma list of model keys: " + ",".join(MODELS))
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rows = run(args.threads, set(args.only.split(",")) if args.only else None, args.repeats)
    for r in rows:
        print(
            f"{r['model']:<18} {r['threads']}t  eager {1e3 * r['eager_s']:8.3f} ms  torchburn {r['eager_s'] / r['torchburn_s']:.2f}×  "
            f"inductor {r['eager_s'] / r['inductor_s']:.2f}×  ({r['notes']})"
        )
    print("\n".join(render(rows)))


if __name__ == "__main__":
    main()
