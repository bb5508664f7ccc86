"""Turbo-Torch examples and real training scripts: the same losses as with ``import torch``."""

from __future__ import annotations

import types

import pytest
import torch

import turbo_torch


def _ns(turbo: bool) -> types.SimpleNamespace:
    t = turbo_torch if turbo else torch
    return types.SimpleNamespace(torch=t, nn=t.nn, optim=t.optim, F=t.nn.functional)


def readme_mlp(ns: types.SimpleNamespace) -> list[float]:
    """The README example: an MLP forward pass."""
    torch, nn = ns.torch, ns.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    x = torch.randn(64, 784)
    with torch.no_grad():
        return model(x).flatten().tolist()


def network_adam(ns: types.SimpleNamespace, steps: int = 20) -> list[float]:
    """The Network class with an Adam training loop."""
    torch, nn, optim, F = ns.torch, ns.nn, ns.optim, ns.F

    class Network(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(784, 512)
            self.fc2 = nn.Linear(512, 10)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.fc2(F.relu(self.fc1(x)))

    torch.manual_seed(0)
    model = Network()
    opt = optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 784, generator=gen)
        y = torch.randint(0, 10, (64,), generator=gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def mlp_script(ns: types.SimpleNamespace, optimizer: str, steps: int = 50) -> list[float]:
    torch, nn, optim = ns.torch, ns.nn, ns.optim
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 5))
    if optimizer == "adamw":
        opt = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    elif optimizer == "adam_wd":
        opt = optim.Adam(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.8, 0.99))
    elif optimizer == "sgd":
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    elif optimizer == "sgd_nesterov":
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, dampening=0.0)
    else:
        opt = optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(50 * 16, 32), torch.randint(0, 5, (50 * 16,)))
    losses = []
    for x, y in torch.utils.data.DataLoader(data, batch_size=16, shuffle=False):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert len(losses) == steps
    return losses + [p.detach().sum().item() for p in model.parameters()]


def cnn_script(ns: types.SimpleNamespace, steps: int = 50) -> list[float]:
    torch, nn, optim = ns.torch, ns.nn, ns.optim

    class SmallCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1),
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
            )
            self.head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.head(self.features(x))

    torch.manual_seed(0)
    model = SmallCNN()
    opt = optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 1, 12, 12, generator=gen)
        y = torch.randint(0, 4, (8,), generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        losses.extend(model(torch.randn(2, 1, 12, 12, generator=gen)).flatten().tolist())
    return losses


SCRIPTS = {
    "readme_mlp": readme_mlp,
    "network_adam": network_adam,
    "mlp_adamw": lambda ns: mlp_script(ns, "adamw"),
    "mlp_adam_wd": lambda ns: mlp_script(ns, "adam_wd"),
    "mlp_sgd_momentum": lambda ns: mlp_script(ns, "sgd"),
    "mlp_sgd_nesterov": lambda ns: mlp_script(ns, "sgd_nesterov"),
    "mlp_sgd_plain": lambda ns: mlp_script(ns, "plain"),
    "cnn_adam": cnn_script,
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_same_losses_as_torch(impl, name: str) -> None:  # type: ignore[no-untyped-def]
    want = SCRIPTS[name](_ns(False))
    got = SCRIPTS[name](_ns(True))
    assert got == want  # bit-identical, not merely close


def test_fast_paths_were_taken(impl, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import turbo_torch.optim as topt

    taken = []
    real = topt._adam_step
    monkeypatch.setattr(topt, "_adam_step", lambda opt: taken.append(1) or real(opt))
    network_adam(_ns(True), steps=3)
    assert taken == [1, 1, 1]
    readme_mlp(_ns(True))
    assert turbo_torch.cache_info()["nn.Sequential"]["misses"] == 1


def test_optimizer_state_dict_interchangeable(impl) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = turbo_torch.nn.Linear(4, 3)
    opt = turbo_torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    ref = torch.optim.Adam(model.parameters(), lr=0.1)
    ref.load_state_dict(opt.state_dict())
    sd_a, sd_b = opt.state_dict(), ref.state_dict()
    assert sd_a["param_groups"] == sd_b["param_groups"]
    for k in sd_a["state"]:
        for name, value in sd_a["state"][k].items():
            assert torch.equal(value, sd_b["state"][k][name]) and value.dtype == sd_b["state"][k][name].dtype


def test_optimizer_hooks_and_closure_use_torch_step(impl) -> None:  # type: ignore[no-untyped-def]
    model = turbo_torch.nn.Linear(2, 1)
    opt = turbo_torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: seen.append("post"))
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert seen == ["pre", "post"]

    def closure():  # type: ignore[no-untyped-def]
        opt.zero_grad()
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        return loss

    assert isinstance(opt.step(closure), torch.Tensor)


def test_amsgrad_and_lr_scheduler(impl) -> None:  # type: ignore[no-untyped-def]
    def run(ns):  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        m = ns.nn.Linear(4, 2)
        opt = ns.optim.Adam(m.parameters(), lr=0.05, amsgrad=True)
        sched = ns.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        out = []
        for _ in range(5):
            opt.zero_grad()
            loss = m(torch.ones(3, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            sched.step()
            out.append(loss.item())
        return out

    assert run(_ns(True)) == run(_ns(False))
