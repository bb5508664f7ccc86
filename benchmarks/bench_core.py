"""tb-core rows: the README model and a training step through the torchburn backend, with
whatever engines are installed, against eager and inductor in the same run."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.harness import first_call, interleaved


def run(threads: int) -> list[dict[str, Any]]:
    import torchburn
    from torchburn.testing.models import TrainMLP, readme_mlp

    torch.set_num_threads(threads)
    rows = []
    model, (x,) = readme_mlp(batch=32)
    with torch.no_grad():
        torch._dynamo.reset()
        tb = torch.compile(model, backend="torchburn", options={"warn": False})
        tb_first = first_call(lambda: tb(x))
        ind = torch.compile(model)
        ind_first = first_call(lambda: ind(x))
        times = interleaved({"eager": lambda: model(x), "torchburn": lambda: tb(x), "inductor": lambda: ind(x)})
    rows.append(
        {
            "suite": "core",
            "name": "README model 512→1024→ReLU→256, batch 32",
            "engines": ",".join(torchburn.active_engines()) or "eager",
            "threads": threads,
            "eager_s": times["eager"],
            "torchburn_s": times["torchburn"],
            "inductor_s": times["inductor"],
            "torchburn_first_s": tb_first,
            "inductor_first_s": ind_first,
        }
    )

    def step_fn(compiled: bool) -> Any:
        torch.manual_seed(0)
        m = TrainMLP()
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        f = torch.compile(m, backend="torchburn", options={"warn": False}) if compiled else m
        xb, yb = torch.randn(64, 784), torch.randint(0, 10, (64,))

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(f(xb), yb).backward()
            opt.step()

        return step

    eager_step, tb_step = step_fn(False), step_fn(True)
    first = first_call(tb_step)
    times = interleaved({"eager": eager_step, "torchburn": tb_step})
    rows.append(
        {
            "suite": "core",
            "name": "training step MLP 784→512→10, batch 64, Adam",
            "engines": ",".join(torchburn.active_engines()) or "eager",
            "threads": threads,
            "eager_s": times["eager"],
            "torchburn_s": times["torchburn"],
            "torchburn_first_s": first,
        }
    )
    return rows
