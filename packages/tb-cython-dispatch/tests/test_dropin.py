"""``import turbo_torch as torch`` behaves as ``import torch``: names, modules, hooks, jit, compile, pickling."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import turbo_torch
from turbo_torch import nn, optim


def test_every_torch_name_resolves() -> None:
    for name in [
        "tensor",
        "randn",
        "float32",
        "bfloat16",
        "device",
        "no_grad",
        "inference_mode",
        "Tensor",
        "add",
        "cat",
        "manual_seed",
        "jit",
        "autograd",
        "compile",
        "cuda",
        "Size",
        "strided",
    ]:
        assert getattr(turbo_torch, name) is getattr(torch, name), name
    missing = [n for n in dir(torch) if not n.startswith("__") and not hasattr(turbo_torch, n)]
    assert not missing
    with pytest.raises(AttributeError):
        turbo_torch.definitely_not_a_torch_name  # noqa: B018


def test_submodules_import() -> None:
    import turbo_torch.nn.functional as F
    import turbo_torch.utils.data as data
    from turbo_torch.optim import lr_scheduler
    from turbo_torch.utils.data import DataLoader, TensorDataset

    assert F is torch.nn.functional and data is torch.utils.data
    assert lr_scheduler is torch.optim.lr_scheduler and DataLoader is torch.utils.data.DataLoader
    assert turbo_torch.nn.functional is torch.nn.functional
    assert nn.init is torch.nn.init and nn.Parameter is torch.nn.Parameter
    assert torch.utils.data.__spec__.name == "torch.utils.data"
    ds = TensorDataset(turbo_torch.arange(6.0).reshape(3, 2))
    assert len(list(DataLoader(ds, batch_size=2))) == 2


def test_module_classes_are_torch_classes() -> None:
    lin = nn.Linear(3, 4)
    assert isinstance(lin, torch.nn.Linear) and isinstance(lin, torch.nn.Module)
    assert type(lin).__module__ == "turbo_torch.nn" and type(lin).__name__ == "Linear"
    assert nn.Conv2d is nn.Conv2d and issubclass(nn.Conv2d, torch.nn.Conv2d)
    assert list(lin.state_dict()) == ["weight", "bias"]
    with pytest.raises(AttributeError):
        nn.NotAModule  # noqa: B018


def _twin(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    def build(ns):  # type: ignore[no-untyped-def]
        torch.manual_seed(seed)
        return ns.Sequential(
            ns.Linear(6, 12),
            ns.ReLU(),
            ns.Linear(12, 12),
            ns.GELU(approximate="tanh"),
            ns.Linear(12, 8),
            ns.SiLU(),
            ns.Tanh(),
            ns.Sigmoid(),
            ns.Identity(),
            ns.Linear(8, 3),
        )

    return build(nn), build(torch.nn)


@pytest.mark.parametrize("shape", [(5, 6), (6,), (2, 3, 6)])
def test_forward_and_backward_bit_identical(impl, shape) -> None:  # type: ignore[no-untyped-def]
    fast, ref = _twin()
    x = torch.randn(*shape)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = fast(xa), ref(xb)
    assert torch.equal(ya, yb)
    ya.sum().backward()
    yb.sum().backward()
    assert torch.equal(xa.grad, xb.grad)
    for pa, pb in zip(fast.parameters(), ref.parameters()):
        assert torch.equal(pa.grad, pb.grad)
    with torch.no_grad():
        assert torch.equal(fast(x), ref(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 20)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(20, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _plain_net(fast: Net) -> torch.nn.Module:
    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.act, self.fc2 = torch.nn.Linear(10, 20), torch.nn.ReLU(inplace=True), torch.nn.Linear(20, 2)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.fc2(self.act(self.fc1(x)))

    p = Plain()
    p.load_state_dict(fast.state_dict())
    return p


def test_forward_hooks_fall_back(impl) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = Net()
    seen: list[str] = []
    x = torch.randn(4, 10)
    base = net(x)
    h1 = net.fc1.register_forward_hook(lambda m, i, o: seen.append("fc1") or o * 2)
    h2 = net.register_forward_pre_hook(lambda m, i: seen.append("pre"))
    out = net(x)
    assert seen == ["pre", "fc1"]
    plain = _plain_net(net)
    plain.fc1.register_forward_hook(lambda m, i, o: o * 2)
    assert torch.equal(out, plain(x))
    h1.remove()
    h2.remove()
    assert torch.equal(net(x), base)


def test_hooks_inside_sequential_plan(impl) -> None:  # type: ignore[no-untyped-def]
    fast, ref = _twin()
    x = torch.randn(3, 6)
    fast(x)
    seen = []
    fast[1].register_forward_hook(lambda m, i, o: seen.append(o.clone()))  # the ReLU of a fused Linear+ReLU
    ref[1].register_forward_hook(lambda m, i, o: o)
    assert torch.equal(fast(x), ref(x))
    assert len(seen) == 1 and torch.equal(seen[0], torch.relu(ref[0](x)))


def test_global_and_backward_hooks(impl) -> None:  # type: ignore[no-untyped-def]
    fast, _ = _twin()
    x = torch.randn(3, 6)
    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: calls.append(type(m).__name__))
    try:
        fast(x)
    finally:
        handle.remove()
    assert calls.count("Linear") == 4 and calls[-1] == "Sequential"
    grads = []
    fast[0].register_full_backward_hook(lambda m, gi, go: grads.append(go[0].shape))
    fast(x.requires_grad_()).sum().backward()
    assert grads == [torch.Size([3, 12])]


def test_instance_forward_override_is_honoured(impl) -> None:  # type: ignore[no-untyped-def]
    lin = nn.Linear(3, 3)
    lin.forward = lambda x: x * 0  # type: ignore[method-assign]
    assert torch.equal(lin(torch.ones(2, 3)), torch.zeros(2, 3))


def test_subclass_overriding_forward(impl) -> None:  # type: ignore[no-untyped-def]
    class Doubling(nn.Linear):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return super().forward(x) * 2

    torch.manual_seed(0)
    m = nn.Sequential(Doubling(3, 3), nn.ReLU())
    x = torch.randn(2, 3)
    assert torch.equal(m(x), torch.relu(torch.nn.functional.linear(x, m[0].weight, m[0].bias) * 2))


def test_state_dict_and_pickle_roundtrip(impl) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 10)
    net(x)
    buf = io.BytesIO()
    turbo_torch.save(net.state_dict(), buf)
    buf.seek(0)
    other = Net()
    other.load_state_dict(turbo_torch.load(buf))
    assert torch.equal(other(x), net(x))
    seq, _ = _twin()
    seq(torch.randn(2, 6))
    for clone in (pickle.loads(pickle.dumps(seq)), copy.deepcopy(seq)):
        assert not any(k.startswith("_tb_site") for k in clone.__dict__)
        assert type(clone) is type(seq) and torch.equal(clone(torch.ones(1, 6)), seq(torch.ones(1, 6)))
    buf = io.BytesIO()
    torch.save(seq, buf)
    buf.seek(0)
    whole = torch.load(buf, weights_only=False)
    assert torch.equal(whole(torch.ones(1, 6)), seq(torch.ones(1, 6)))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_jit_trace_and_script(impl) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 10)
    traced = torch.jit.trace(net, x)
    assert torch.equal(traced(x), net(x))
    plain = torch.jit.trace(_plain_net(net).eval(), x)
    assert str(traced.inlined_graph).count("aten::linear") == str(plain.inlined_graph).count("aten::linear") == 2
    assert "fc1" in dict(traced.named_children())
    seq, _ = _twin()
    scripted = torch.jit.script(seq)
    assert torch.equal(scripted(x[:, :6]), seq(x[:, :6]))


def test_torch_compile_of_a_turbo_model(impl) -> None:  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 10)
    compiled = torch.compile(net, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), net(x))
    cnt = torch._dynamo.testing.CompileCounter()
    seq, _ = _twin()
    out = torch.compile(seq, backend=cnt, fullgraph=True)(x[:, :6])
    assert torch.equal(out, seq(x[:, :6])) and cnt.frame_count == 1


def test_module_compile_method(impl) -> None:  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 10)
    want = net(x)
    net.compile(backend="eager")
    assert torch.equal(net(x), want)


def test_train_eval_and_dropout(impl) -> None:  # type: ignore[no-untyped-def]
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.ReLU())
    x = torch.randn(8, 4)
    torch.manual_seed(1)
    a = m(x)
    torch.manual_seed(1)
    b = torch.nn.Module.__call__(m[2], torch.nn.Module.__call__(m[1], torch.nn.Module.__call__(m[0], x)))
    assert torch.equal(a, b)
    m.eval()
    assert torch.equal(m(x), torch.relu(m[0](x)))


def test_optim_names() -> None:
    assert issubclass(optim.Adam, torch.optim.Adam) and optim.RMSprop is torch.optim.RMSprop
    assert optim.lr_scheduler.StepLR is torch.optim.lr_scheduler.StepLR
