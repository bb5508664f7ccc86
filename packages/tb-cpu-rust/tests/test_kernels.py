"""Kernels against PyTorch: GEMM epilogues fused by the lowering, the memory plan, online
softmax, the AVX-512 activations, and every GEMM backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from native_helpers import run_native as _run_native

from tb_cpu_rust import _native
from torchburn.testing.conformance import compile_with


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The lowered spec of every partition compiled while the test runs."""
    from tb_cpu_rust import lower as lower_mod
    from tb_cpu_rust import program

    seen: list[dict[str, Any]] = []

    def record(plan: Any) -> dict[str, Any]:
        result = lower_mod.lower(plan)
        seen.append(result["spec"])
        return result

    monkeypatch.setattr(program, "lower", record)
    return seen


def _gemm_steps(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for spec in specs for s in spec["steps"] if s["op"] == "gemm"]


@pytest.mark.parametrize(
    ("act", "name"),
    [(torch.relu, "relu"), (F.gelu, "gelu"), (F.silu, "silu"), (torch.sigmoid, "sigmoid"), (torch.tanh, "tanh")],
)
def test_linear_activation_is_one_gemm_with_an_epilogue(
    act: Callable[..., Any], name: str, lowered: list[dict[str, Any]]
) -> None:
    lin = torch.nn.Linear(70, 45)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return act(lin(x))

    x = torch.randn(33, 70)
    x[0, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    torch.testing.assert_close(_run_native(fn, x), fn(x), equal_nan=True)
    steps = [s for spec in lowered for s in spec["steps"]]
    assert [s["op"] for s in steps] == ["gemm"], steps
    assert steps[0]["epilogue"] == [name]


def test_residual_add_and_activation_chain_fuse_into_the_gemm(lowered: list[dict[str, Any]]) -> None:
    lin = torch.nn.Linear(64, 64)

    def fn(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.relu(lin(x) + r * 2.0)

    x, r = torch.randn(40, 64), torch.randn(40, 64)
    torch.testing.assert_close(_run_native(fn, x, r), fn(x, r))
    gemm = _gemm_steps(lowered)
    assert len(gemm) == 1 and gemm[0]["epilogue"] == ["add", "relu"]


def test_gemm_result_read_twice_is_not_fused(lowered: list[dict[str, Any]]) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = a @ b
        return torch.relu(c), c

    a, b = torch.randn(20, 30), torch.randn(30, 10)
    got = _run_native(fn, a, b)
    for g, e in zip(got, fn(a, b)):
        torch.testing.assert_close(g, e)
    assert _gemm_steps(lowered)[0]["epilogue"] == []


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 7, 3), (64, 64, 64), (130, 70, 600), (9, 1025, 33)])
def test_every_gemm_backend_matches_torch(shape: tuple[int, int, int], transpose: bool) -> None:
    m, k, n = shape
    a = torch.randn(m, k)
    b = torch.randn(n, k).t() if transpose else torch.randn(k, n)
    bias = torch.randn(n)
    fn = lambda a, b, bias: torch.addmm(bias, a, b, beta=0.5, alpha=2.0)  # noqa: E731
    compiled, _ = compile_with("native_cpu", fn, cache=False)
    want = fn(a, b, bias)
    backends = ["gemm", "matrixmultiply"] + (["own"] if _native.isa() == "avx512" else [])
    try:
        for be in backends:
            _native.set_gemm_backend(be)
            torch.testing.assert_close(compiled(a, b, bias), want, rtol=1e-4, atol=1e-4 * k**0.5)
    finally:
        _native.set_gemm_backend("auto")
    with pytest.raises(ValueError, match="unknown GEMM backend"):
        _native.set_gemm_backend("blas")


def _rows_with_specials() -> Iterator[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    for n in (1, 15, 16, 17, 64, 65, 1000, 2048):
        x = torch.randn(3, n, generator=g) * 4
        yield x
    x = torch.randn(4, 300, generator=g)
    x[0, 5] = float("nan")
    x[1, :] = float("-inf")
    x[2, 7] = float("-inf")
    x[3, 299] = 60.0
    yield x


@pytest.mark.parametrize("log", [False, True])
def test_online_softmax_matches_torch_over_shapes_strides_and_specials(log: bool) -> None:
    op = torch.log_softmax if log else torch.softmax
    for x in _rows_with_specials():
        for dim in (-1, 0):
            torch.testing.assert_close(_run_native(lambda t, d=dim: op(t, d), x), op(x, dim), equal_nan=True)
        xt = x.t()  # non-contiguous rows
        torch.testing.assert_close(_run_native(lambda t: op(t, 0), xt), op(xt, 0), equal_nan=True)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


@pytest.mark.parametrize("act", [F.gelu, _gelu_tanh, F.silu, torch.sigmoid, torch.exp, torch.tanh])
def test_vector_activations_match_torch(act: Callable[..., Any]) -> None:
    x = torch.cat([torch.linspace(-30, 30, 10007), torch.tensor([0.0, -0.0, 88.0, 89.0, -87.5, -104.5, 1e-30])])
    x = torch.cat([x, torch.tensor([float("inf"), float("-inf"), float("nan")])])
    want = act(x)
    # torch's vectorised float32 gelu says NaN at +inf (its scalar and float64 kernels say inf):
    # there the engine is held to the float64 answer
    want = torch.where(torch.isnan(want) & ~torch.isnan(x), act(x.double()).float(), want)
    torch.testing.assert_close(_run_native(act, x), want, equal_nan=True)
    big = torch.randn(300, 257)[:, 1:]  # strided rows, large enough for threads
    torch.testing.assert_close(_run_native(act, big), act(big))


def test_memory_plan_shares_temporaries(lowered: list[dict[str, Any]]) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(6):
            y = torch.softmax(y, -1)  # each softmax is a kernel step with a temporary result
        return y

    x = torch.randn(16, 50)
    torch.testing.assert_close(_run_native(fn, x), fn(x))
    spec = lowered[0]
    temps = [b for b in spec["buffers"] if b["kind"] == "temp"]
    # five intermediates, never more than two alive at once (one read, one written)
    assert len(temps) == 2, spec["buffers"]


def _idx(gen: torch.Generator, size: int, shape: tuple[int, ...]) -> torch.Tensor:
    """int64 indices in [-size, size): negative ones count from the end, as in PyTorch."""
    return torch.randint(-size, size, shape, generator=gen) if size else torch.zeros(shape, dtype=torch.int64)


# (x shape, index pattern): an int is an index tensor of that shape, None a full slice
_INDEX_CASES: list[tuple[tuple[int, ...], list[Any]]] = [
    ((5, 6, 7), [None, (3,)]),  # x[:, i]
    ((5, 6, 7), [None, None, (4, 2)]),  # x[:, :, i2d]
    ((2, 3, 9, 11), [None, None, (18, 1), (22,)]),  # nearest upsampling's form
    ((5, 6, 7), [(3,), None, (3,)]),  # non-adjacent: broadcast dims go first
    ((4, 5, 6, 7), [None, (2, 1), None, (3,)]),  # non-adjacent after a slice
    ((5, 6, 7), [(2, 3), (3,), None]),  # trailing slice
    ((5, 6, 7), [None, (0,)]),  # empty index
    ((5, 0, 7), [None, None, (4,)]),  # empty input dimension
    ((6,), [(2, 2)]),
]


@pytest.mark.parametrize("case", range(len(_INDEX_CASES)))
@pytest.mark.parametrize("transposed", [False, True])
def test_advanced_indexing_with_slices_matches_torch(case: int, transposed: bool) -> None:
    shape, pattern = _INDEX_CASES[case]
    gen = torch.Generator().manual_seed(case)
    if transposed:  # same values, every dimension strided
        x = torch.randn(*reversed(shape), generator=gen).permute(*reversed(range(len(shape))))
    else:
        x = torch.randn(*shape, generator=gen)
    idx = [None if p is None else _idx(gen, shape[d], p) for d, p in enumerate(pattern)]

    def fn(x: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        it = iter(tensors)
        return x[tuple(slice(None) if p is None else next(it) for p in pattern)] * 2.0

    tensors = [i for i in idx if i is not None]
    torch.testing.assert_close(_run_native(fn, x, *tensors), fn(x, *tensors))


@pytest.mark.parametrize(
    "kw",
    [
        {"scale_factor": 2, "mode": "nearest"},
        {"size": (5, 17), "mode": "nearest"},
        {"size": (13, 7), "mode": "bilinear", "align_corners": False},
        {"scale_factor": 1.5, "mode": "bilinear", "align_corners": True},
        {"size": (1, 1), "mode": "bilinear", "align_corners": False},
    ],
)
def test_interpolate_runs_native_and_matches_torch(kw: dict[str, Any]) -> None:
    x = torch.randn(2, 3, 9, 11)
    if kw["mode"] == "nearest":
        # (bilinear at ±inf: PyTorch's own decomposition, which tb-core lowers, gives nan where
        # the eager kernel's zero weight times inf does not, or the reverse; not an engine matter)
        x[0, 0, 0, 0] = float("inf")
        x[1, 2, 3, 4] = float("nan")

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, **kw)

    torch.testing.assert_close(_run_native(fn, x), fn(x), equal_nan=True)


@pytest.mark.parametrize(
    ("shape", "out_size"),
    [
        ((2, 3, 9, 11), (4, 5)),  # uneven: windows overlap
        ((2, 3, 8, 12), (4, 3)),  # even: plain pooling windows
        ((1, 2, 7, 7), (1, 1)),  # global
        ((1, 2, 5, 6), (5, 6)),  # identity
        ((2, 3, 4, 5), (7, 9)),  # more cells than inputs: windows of one, repeated
        ((3, 9, 11), (2, 4)),  # unbatched (C, H, W)
        ((0, 3, 9, 11), (4, 5)),  # empty batch
    ],
)
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_adaptive_pooling_matches_torch(shape: tuple[int, ...], out_size: tuple[int, int], kind: str) -> None:
    gen = torch.Generator().manual_seed(len(shape) + out_size[0])
    x = torch.randn(*shape, generator=gen).transpose(-1, -2).contiguous().transpose(-1, -2)  # column-major planes
    if x.numel():
        flat = x.as_strided((x.numel(),), (1,))  # the storage, in memory order
        flat[3], flat[7], flat[11] = float("nan"), float("inf"), float("-inf")

    if kind == "avg":

        def fn(x: torch.Tensor) -> torch.Tensor:
            return F.adaptive_avg_pool2d(x, out_size) + 1.0

    else:

        def fn(x: torch.Tensor) -> Any:  # type: ignore[misc]
            values, indices = F.adaptive_max_pool2d(x, out_size, return_indices=True)
            return values + 1.0, indices

    got, want = _run_native(fn, x), fn(x)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize(
    ("x_shape", "cout", "k", "kw"),
    [
        ((2, 4, 5, 6), 3, (3, 3), {}),
        ((2, 4, 5, 6), 3, (3, 2), {"stride": 2, "padding": 1, "output_padding": 1}),
        ((1, 4, 5, 6), 6, (3, 3), {"stride": (2, 3), "dilation": 2, "groups": 2}),
        ((3, 2, 4, 4), 2, (1, 1), {"bias": False}),
        ((2, 6, 3, 7), 4, (2, 4), {"stride": 3, "padding": (0, 2), "output_padding": (2, 1), "groups": 2}),
        ((2, 4, 9), 5, (3,), {"stride": 2, "padding": 1}),  # 1-d
    ],
)
@pytest.mark.parametrize("strided_input", [False, True])
def test_transposed_convolution_matches_torch(
    x_shape: tuple[int, ...], cout: int, k: tuple[int, ...], kw: dict[str, Any], strided_input: bool
) -> None:
    gen = torch.Generator().manual_seed(sum(x_shape) + cout)
    groups = kw.get("groups", 1)
    conv_cls = torch.nn.ConvTranspose2d if len(k) == 2 else torch.nn.ConvTranspose1d
    conv = conv_cls(x_shape[1], cout, k, **kw)
    x = torch.randn(*x_shape, generator=gen)
    if strided_input:  # channels-last storage: no dimension has unit stride where the kernel expects it
        x = x.transpose(1, -1).contiguous().transpose(1, -1)
    assert conv.weight.shape[0] == x_shape[1] and conv.weight.shape[1] == cout // groups

    def fn(x: torch.Tensor) -> torch.Tensor:
        return conv(x)

    with torch.no_grad():
        torch.testing.assert_close(_run_native(fn, x), fn(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "kw"),
    [
        ((2, 3, 6, 7, 8), {"kernel_size": 2}),
        ((2, 3, 6, 7, 8), {"kernel_size": (3, 2, 3), "stride": (2, 1, 2), "padding": 1}),
        ((1, 2, 5, 5, 5), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
        ((3, 5, 6, 7), {"kernel_size": 2, "stride": 1}),  # unbatched (C, D, H, W)
        ((0, 2, 4, 4, 4), {"kernel_size": 2}),  # empty batch
    ],
)
@pytest.mark.parametrize("kind", ["max", "max_dilated", "avg", "avg_exclude_pad", "avg_divisor"])
def test_3d_pooling_matches_torch(shape: tuple[int, ...], kw: dict[str, Any], kind: str) -> None:
    gen = torch.Generator().manual_seed(len(shape) + kw["kernel_size"] if isinstance(kw["kernel_size"], int) else 7)
    x = torch.randn(*shape, generator=gen).transpose(-1, -3)  # strided: no unit-stride last dim
    if x.numel():
        flat = x.as_strided((x.numel(),), (1,))
        flat[1], flat[2], flat[9], flat[17] = float("nan"), float("nan"), float("inf"), float("-inf")

    def fn(x: torch.Tensor) -> Any:
        if kind.startswith("max"):
            extra = {"dilation": 2} if kind == "max_dilated" and not kw.get("padding") else {}
            values, indices = F.max_pool3d(x, **kw, **extra, return_indices=True)
            return values * 2.0, indices
        extra = {"count_include_pad": False} if kind == "avg_exclude_pad" else {}
        if kind == "avg_divisor":
            extra = {"divisor_override": 5}
        return F.avg_pool3d(x, **kw, **extra) * 2.0

    torch.testing.assert_close(_run_native(fn, x), fn(x), equal_nan=True)


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
@pytest.mark.parametrize(("n", "k"), [(7, 5), (1, 1), (33, 130), (0, 4), (4, 0)])
def test_addmv_matches_torch(n: int, k: int, beta: float) -> None:
    gen = torch.Generator().manual_seed(n * 100 + k)
    bias = torch.randn(n, generator=gen)
    if n and beta == 0.0:
        bias[0] = float("nan")  # beta = 0 ignores the bias, NaN included
    mat = torch.randn(k, n, generator=gen).t()  # transposed storage
    vec = torch.randn(2 * k, generator=gen)[::2]  # strided vector

    def fn(bias: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
        return torch.addmv(bias, mat, vec, beta=beta, alpha=1.5)

    torch.testing.assert_close(_run_native(fn, bias, mat, vec), fn(bias, mat, vec), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
@pytest.mark.parametrize(
    ("shape", "dim"), [((7,), 0), ((4, 9), 1), ((4, 9), 0), ((3, 0, 2), 1), ((), 0), ((2, 3, 5), -1)]
)
def test_cummax_cummin_match_torch(op: Callable[..., Any], shape: tuple[int, ...], dim: int) -> None:
    gen = torch.Generator().manual_seed(len(shape) * 10 + dim)
    x = torch.randint(-3, 4, shape, generator=gen).float()  # small integers: many ties
    if x.dim() == 2:
        x = x.t().contiguous().t()  # column-major storage
    if x.numel() > 6:  # a NaN mid-line (it sticks) and an inf at the end of the first line
        first_line = (0,) * (x.dim() - 1)
        x[(*first_line, 2)] = float("nan")
        x[(*first_line, x.shape[-1] - 1)] = float("inf")

    def fn(x: torch.Tensor) -> Any:
        values, indices = op(x, dim)
        return values * 2.0, indices

    torch.testing.assert_close(_run_native(fn, x), fn(x), equal_nan=True)


@pytest.mark.parametrize(
    ("shape", "out_size"),
    [
        ((2, 3, 5, 9, 11), (2, 4, 5)),
        ((1, 2, 4, 4, 4), (4, 2, 1)),
        ((3, 6, 7, 5), (4, 3, 2)),
        ((2, 1, 3, 2, 2), (5, 3, 3)),
    ],
)
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_adaptive_3d_pooling_matches_torch(shape: tuple[int, ...], out_size: tuple[int, ...], kind: str) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen).transpose(-1, -3)
    flat = x.as_strided((x.numel(),), (1,))
    flat[4], flat[5], flat[13] = float("nan"), float("inf"), float("-inf")
    size = (out_size[2], out_size[1], out_size[0])  # x's last three dims were reversed

    def fn(x: torch.Tensor) -> Any:
        if kind == "avg":
            return F.adaptive_avg_pool3d(x, size) * 2.0
        values, indices = F.adaptive_max_pool3d(x, size, return_indices=True)
        return values * 2.0, indices

    torch.testing.assert_close(_run_native(fn, x), fn(x), equal_nan=True)


@pytest.mark.parametrize(
    ("x_shape", "cout", "k", "kw"),
    [
        ((2, 3, 5, 6, 7), 4, (3, 3, 3), {}),
        ((1, 4, 6, 5, 7), 6, (2, 3, 1), {"stride": (2, 1, 3), "padding": (1, 1, 0), "groups": 2}),
        ((2, 2, 7, 7, 7), 3, (3, 2, 3), {"dilation": 2, "padding": 2, "bias": False}),
        ((1, 2, 1, 1, 1), 2, (1, 1, 1), {}),
    ],
)
def test_conv3d_matches_torch(x_shape: tuple[int, ...], cout: int, k: tuple[int, ...], kw: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(sum(x_shape) + cout)
    conv = torch.nn.Conv3d(x_shape[1], cout, k, **kw)
    x = torch.randn(*x_shape, generator=gen).transpose(1, 4).contiguous().transpose(1, 4)  # channels-last

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(conv(x))

    with torch.no_grad():
        torch.testing.assert_close(_run_native(fn, x), fn(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("k_n", [(1, 1), (7, 5), (33, 130), (784, 256), (512, 4096)])
@pytest.mark.parametrize("kind", ["linear_relu", "addmm_beta", "strided_input", "b_rows_contiguous", "residual_gelu"])
def test_small_batch_gemm_matches_torch(rows: int, k_n: tuple[int, int], kind: str) -> None:
    """Batch 1-4 takes the in-place GEMV (gemv.rs) when B's columns are contiguous; 5 and other
    layouts take the blocked GEMM. Both against torch, with the epilogue forms a Linear uses."""
    k, n = k_n
    g = torch.Generator().manual_seed(rows * 1000 + k)
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g)
    r = torch.randn(rows, n, generator=g)
    if kind == "linear_relu":
        fn, args = (lambda x, w, b: torch.relu(F.linear(x, w, b))), (x, w, b)
    elif kind == "addmm_beta":
        fn, args = (lambda x, w, c: torch.addmm(c, x, w.t(), beta=0.5, alpha=2.0)), (x, w, r)
    elif kind == "strided_input":
        xs = torch.randn(rows, 2 * k, generator=g)[:, ::2]
        fn, args = (lambda x, w, b: F.linear(x, w, b)), (xs, w, b)
    elif kind == "b_rows_contiguous":
        fn, args = (lambda x, w: x @ w), (x, w.t().contiguous())
    else:
        fn, args = (lambda x, w, b, r: F.gelu(F.linear(x, w, b) + r)), (x, w, b, r)
    got = _run_native(fn, *args)
    torch.testing.assert_close(got, fn(*args), rtol=1e-4, atol=1e-4)
