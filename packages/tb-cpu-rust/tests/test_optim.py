"""tb_cpu_rust.optim (Adam / AdamW / SGD as one native call per group) against torch.optim."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native
from tb_cpu_rust import optim as tbo

SHAPES = [(), (0,), (7,), (33, 5), (3, 4, 129), (40000,)]  # 0-d, empty, odd, > one 16K chunk


def _params(shapes: list[tuple[int, ...]], seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _run(
    opt_cls: type, params: list[torch.nn.Parameter], kw: dict[str, Any], steps: int, seed: int = 1,
    special: bool = False,
) -> list[torch.nn.Parameter]:  # fmt: skip
    opt = opt_cls(params, **kw)
    g = torch.Generator().manual_seed(seed)
    for i in range(steps):
        for p in params:
            grad = torch.randn(p.shape, generator=g)
            if special and p.numel() > 3 and i == steps - 1:
                grad.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
            p.grad = grad
        opt.step()
    return params, opt


def _check(ours: tuple[list[Any], Any], ref: tuple[list[Any], Any]) -> None:
    (pa, oa), (pb, ob) = ours, ref
    for a, b in zip(pa, pb, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=2e-5, atol=2e-6, equal_nan=True)
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].keys() == sb[k].keys()
        for name in sa[k]:
            torch.testing.assert_close(sa[k][name], sb[k][name], rtol=2e-5, atol=2e-6, equal_nan=True)


ADAM_GRID = [
    dict(zip(("weight_decay", "amsgrad", "maximize", "betas"), v, strict=True))
    for v in itertools.product((0.0, 0.05), (False, True), (False, True), ((0.9, 0.999), (0.3, 0.9)))
]


@pytest.mark.parametrize("kw", ADAM_GRID, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_adam_family_matches_torch(name: str, kw: dict[str, Any]) -> None:
    kw = {"lr": 1e-2, "eps": 1e-8, **kw}
    ours = _run(getattr(tbo, name), _params(SHAPES), kw, steps=6)
    ref = _run(getattr(torch.optim, name), _params(SHAPES), kw, steps=6)
    _check(ours, ref)


@pytest.mark.parametrize(
    "kw",
    [
        {"momentum": 0.0},
        {"momentum": 0.9},
        {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
        {"momentum": 0.5, "dampening": 0.3, "maximize": True},
        {"momentum": 0.0, "weight_decay": 0.1, "maximize": True},
    ],
    ids=str,
)
def test_sgd_matches_torch(kw: dict[str, Any]) -> None:
    kw = {"lr": 0.05, **kw}
    _check(_run(tbo.SGD, _params(SHAPES), kw, steps=5), _run(torch.optim.SGD, _params(SHAPES), kw, steps=5))


@pytest.mark.parametrize("cls", ["Adam", "AdamW", "SGD"])
def test_nan_and_inf_gradients_propagate_like_torch(cls: str) -> None:
    kw: dict[str, Any] = {"lr": 1e-2} | ({"momentum": 0.9} if cls == "SGD" else {"amsgrad": True})
    ours = _run(getattr(tbo, cls), _params(SHAPES), kw, steps=3, special=True)
    ref = _run(getattr(torch.optim, cls), _params(SHAPES), kw, steps=3, special=True)
    assert torch.isnan(ours[0][3]).any()
    _check(ours, ref)


def test_the_native_call_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = _native.optim_adam
    monkeypatch.setattr(tbo._native, "optim_adam", lambda *a: calls.append(len(a[0])) or real(*a))
    params = _params([(3,), (4, 4)])
    opt = tbo.Adam([*params, torch.nn.Parameter(torch.zeros(2))])  # no grad: skipped
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    assert calls == [2]
    assert len(opt.state) == 2 and opt.state[params[0]]["step"].item() == 1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64)),  # float64
        lambda: torch.nn.Parameter(torch.randn(5, 6).t()),  # not contiguous
        lambda: torch.nn.Parameter(torch.randn(3, dtype=torch.complex64)),  # complex
    ],
    ids=["float64", "transposed", "complex"],
)
def test_unsupported_parameters_run_torchs_step(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: Any) -> None:
        raise AssertionError("native step taken for an unsupported parameter")

    monkeypatch.setattr(tbo._native, "optim_adam", boom)
    torch.manual_seed(0)
    p = make()
    q = torch.nn.Parameter(p.detach().clone())
    ours, ref = tbo.Adam([p], lr=0.1, amsgrad=True), torch.optim.Adam([q], lr=0.1, amsgrad=True)
    for _ in range(3):
        p.grad = torch.ones_like(p)
        q.grad = torch.ones_like(q)
        ours.step()
        ref.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("cls", ["Adam", "AdamW", "SGD"])
def test_hooks_run_once_on_the_fallback_path(cls: str) -> None:
    # a torch optimizer of the same class first, so torch has wrapped its class's step with hooks
    getattr(torch.optim, cls)([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    p = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))  # float64: torch's own step
    q = torch.nn.Parameter(p.detach().clone())
    ours, ref = getattr(tbo, cls)([p], lr=0.1), getattr(torch.optim, cls)([q], lr=0.1)
    seen: list[str] = []
    ours.register_step_pre_hook(lambda *_: seen.append("pre"))
    ours.register_step_post_hook(lambda *_: seen.append("post"))
    p.grad, q.grad = torch.ones_like(p), torch.ones_like(q)
    ours.step()
    ref.step()
    assert seen == ["pre", "post"]
    torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=0)


def test_state_dict_moves_between_torch_and_native() -> None:
    kw = {"lr": 3e-3, "weight_decay": 0.01, "amsgrad": True}
    a, b = _params(SHAPES), _params(SHAPES)
    pa, ta = _run(torch.optim.AdamW, a, kw, steps=3)
    pb, tb_ = _run(torch.optim.AdamW, b, kw, steps=3)
    native = tbo.AdamW(pb, **kw)
    native.load_state_dict(copy.deepcopy(tb_.state_dict()))
    g = torch.Generator().manual_seed(9)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in pa]
        for p, q, gr in zip(pa, pb, grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        ta.step()
        native.step()
    _check((pb, native), (pa, ta))
    # and back: torch continues from the native optimizer's state
    back = torch.optim.AdamW(pb, **kw)
    back.load_state_dict(native.state_dict())
    assert back.state[pb[0]]["step"].item() == 6.0


def test_closure_hooks_and_tensor_lr() -> None:
    p = _params([(10,)])[0]
    seen: list[str] = []
    opt = tbo.Adam([p], lr=torch.tensor(0.01))
    opt.register_step_pre_hook(lambda *_: seen.append("pre"))
    opt.register_step_post_hook(lambda *_: seen.append("post"))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    before = p.detach().clone()
    loss = opt.step(closure)
    assert seen == ["pre", "post"]
    assert isinstance(loss, torch.Tensor)
    q = torch.nn.Parameter(before.clone())
    ref = torch.optim.Adam([q], lr=torch.tensor(0.01))
    q.grad = 2 * before
    ref.step()
    torch.testing.assert_close(p.detach(), q.detach())


def test_training_with_a_compiled_model_tracks_eager() -> None:
    import torch.nn.functional as F

    x, y = torch.randn(32, 20), torch.randint(0, 5, (32,))

    def train(native: bool) -> list[float]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
        opt = (tbo.Adam if native else torch.optim.Adam)(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    torch.testing.assert_close(train(True), train(False), rtol=1e-5, atol=1e-6)


# -- the Rust boundary ------------------------------------------------------------------------


def _a(t: torch.Tensor) -> torch.Tensor:
    return t  # the native entries take the tensors themselves


def _adam_args(n: int = 6) -> tuple[list[torch.Tensor], list[Any]]:
    ts = [torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n), torch.tensor(0.0)]
    return ts, [[_a(ts[0])], [_a(ts[1])], [_a(ts[2])], [_a(ts[3])], [], [_a(ts[4])]]


HYPER = (1e-3, 0.9, 0.999, 1e-8, 0.0, False, False, False)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda ts, a: a[1].__setitem__(0, _a(ts[1].double())), "grads\\[0\\]: expected dtype float32"),
        (lambda ts, a: a[2].__setitem__(0, _a(torch.zeros(5))), "exp_avgs\\[0\\]: shape"),
        (lambda ts, a: a[3].__setitem__(0, a[0][0]), "overlaps"),
        (lambda ts, a: a[2].__setitem__(0, _a(torch.zeros(6, 2).t()[0])), "must be contiguous"),
        (lambda ts, a: a[1].append(a[1][0]), "grads: 2 tensors for 1 parameters"),
        (lambda ts, a: a[5].__setitem__(0, _a(torch.zeros(2))), "steps\\[0\\]: expected one element"),
        (lambda ts, a: a[0].__setitem__(0, (ts[0].data_ptr(), (6,), (1,), "torch.float32")), "expected a torch.Tensor"),
        (
            lambda ts, a: a[0].__setitem__(0, torch.frombuffer(bytearray(25), dtype=torch.float32, offset=1)),
            "not aligned",
        ),
    ],
    ids=["dtype", "shape", "overlap", "strided", "count", "step-shape", "address", "misaligned"],
)
def test_bad_calls_raise_and_change_nothing(mutate: Any, match: str) -> None:
    ts, args = _adam_args()
    mutate(ts, args)
    before = [t.clone() for t in ts]
    with pytest.raises((ValueError, TypeError), match=match):
        _native.optim_adam(*args, *HYPER)
    for t, b in zip(ts, before, strict=True):
        assert torch.equal(t, b)


def test_non_finite_hyperparameters_are_rejected() -> None:
    _, args = _adam_args()
    with pytest.raises(ValueError, match="lr must be finite"):
        _native.optim_adam(*args, float("nan"), *HYPER[1:])
    p, g = torch.zeros(3), torch.zeros(3)
    with pytest.raises(ValueError, match="momentum_buffers: 0 tensors"):
        _native.optim_sgd([_a(p)], [_a(g)], [], [], 0.1, 0.9, 0.0, 0.0, False, False)


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple), min_size=1, max_size=4),
    lr=st.floats(1e-4, 1.0),
    beta1=st.floats(0.0, 0.99),
    beta2=st.floats(0.5, 0.9999),
    wd=st.sampled_from([0.0, 1e-3, 0.5]),
    amsgrad=st.booleans(),
    maximize=st.booleans(),
    decoupled=st.booleans(),
    steps=st.integers(1, 3),
)
def test_adam_property(
    shapes: list[tuple[int, ...]], lr: float, beta1: float, beta2: float, wd: float, amsgrad: bool,
    maximize: bool, decoupled: bool, steps: int,
) -> None:  # fmt: skip
    kw = {"lr": lr, "betas": (beta1, beta2), "weight_decay": wd, "amsgrad": amsgrad, "maximize": maximize}
    name = "AdamW" if decoupled else "Adam"
    ours = _run(getattr(tbo, name), _params(shapes), kw, steps)
    ref = _run(getattr(torch.optim, name), _params(shapes), kw, steps)
    _check(ours, ref)
