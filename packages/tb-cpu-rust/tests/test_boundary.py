"""Property tests at the FFI boundary: every tensor crosses as the tensor itself, read from its own
DLPack description; bad layouts, dtypes, devices, non-tensors and overlapping outputs are Python
exceptions, never a crash. (test_native_fuzz.py throws bad arguments at every entry.)"""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native
from tb_cpu_rust.threads import use_torch_openmp

READERS = ["exchange", "capsule"] if _native._dlpack_reader() == "exchange" else ["capsule"]


@pytest.fixture(params=READERS, scope="module")
def reader(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test under each DLPack reader this torch has (the capsule one is older torch's)."""
    before = _native._dlpack_reader()
    _native._dlpack_reader(request.param)
    yield request.param
    _native._dlpack_reader(before)


def _copy_spec(sizes: list[int], strides: list[int], dtype: str = "float32", outputs: int = 1) -> str:
    """A plan that copies an input of the given layout into each of `outputs` contiguous outputs."""
    numel = 1
    for s in sizes:
        numel *= s
    out_strides = []
    acc = 1
    for s in reversed(sizes):
        out_strides.insert(0, acc)
        acc *= max(s, 1)
    compute = "f32" if dtype == "float32" else "i64"
    prog = [{"op": "load", "dst": 0, "a": [0]}, {"op": "store", "dst": 0, "a": [0]}]
    return json.dumps(
        {
            "buffers": [{"kind": "input", "dtype": dtype, "numel": 0, "sizes": sizes, "strides": strides}]
            + [{"kind": "output", "dtype": dtype, "numel": numel}] * outputs,
            "values": [
                {"buf": b, "offset": 0, "sizes": sizes, "strides": strides if b == 0 else out_strides}
                for b in range(1 + outputs)
            ],
            "steps": [
                {"op": "ew", "compute": compute, "ins": [0], "outs": [1 + k], "prog": prog} for k in range(outputs)
            ],
        }
    )


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4)


def _window(shape: list[int], data: st.DataObject) -> torch.Tensor:
    """A random strided window of a larger tensor: steps give arbitrary non-negative strides."""
    base = torch.randn(*[2 * s + 2 for s in shape]) if shape else torch.randn(())
    steps = [data.draw(st.integers(1, 2)) for _ in shape]
    x = base[tuple(slice(1, 1 + s * k, k) for s, k in zip(shape, steps))] if shape else base
    if data.draw(st.booleans()) and x.dim() >= 2:
        x = x.transpose(0, 1)
    return x


@settings(max_examples=60, deadline=None)
@given(shape=shapes, data=st.data())
def test_any_valid_layout_round_trips(reader: str, shape: list[int], data: st.DataObject) -> None:
    x = _window(shape, data)
    ex = _native.Executor(_copy_spec(list(x.shape), list(x.stride())))
    out, out2 = torch.full(x.shape, -1.0), torch.full(x.shape, -2.0)
    ex.run([x], [out])
    ex.run_ptrs((x,), (out2,))  # the former pointer entry: the same validated call
    assert torch.equal(out, x) and torch.equal(out2, x)


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 4), min_size=0, max_size=4),
    strides=st.lists(st.sampled_from([0, 1, 2, 5, 2**40, 2**61]), min_size=4, max_size=4),
    dtype=st.sampled_from(
        [
            torch.float32,
            torch.int64,
            torch.bool,
            torch.float16,
            torch.bfloat16,
            torch.complex64,
            torch.uint16,
            torch.uint32,
            torch.float8_e5m2,
        ]
    ),
)
def test_validate_tensor_reads_the_extent_torch_describes(
    reader: str, sizes: list[int], strides: list[int], dtype: torch.dtype
) -> None:
    strides = strides[: len(sizes)]
    extent = 0 if 0 in sizes else 1 + sum((s - 1) * t for s, t in zip(sizes, strides))
    if extent > 1 << 16:
        # torch refuses a view beyond its storage; a huge stride is only real over dims of size 0 or 1
        with pytest.raises(RuntimeError):
            torch.empty(64, dtype=dtype).as_strided(sizes, strides)
        return
    t = torch.zeros(max(extent, 1), dtype=dtype).as_strided(sizes, strides)
    if dtype in (torch.uint16, torch.uint32, torch.float8_e5m2):
        with pytest.raises(ValueError, match="is not one native_cpu takes"):
            _native.validate_tensor(t)
        return
    assert _native.validate_tensor(t) == extent


def test_huge_strides_over_empty_and_single_dims_are_valid(reader: str) -> None:
    assert _native.validate_tensor(torch.empty(0).as_strided((0, 7), (2**62, 1))) == 0
    assert _native.validate_tensor(torch.empty(1).as_strided((1, 1, 1), (2**62, 2**61, 2**60))) == 1


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda t: t.data_ptr(), TypeError, "expected a torch.Tensor, got int"),
        (lambda t: (t.data_ptr(), list(t.shape), list(t.stride()), "float32"), TypeError, "got tuple"),
        (lambda t: torch._C._to_dlpack(t), TypeError, "got PyCapsule"),
        (lambda t: t.numpy(), TypeError, "got ndarray"),
        (lambda t: torch.empty(t.shape, device="meta"), ValueError, "meta"),
        (lambda t: t.to_sparse(), ValueError, "storage"),
        (lambda t: torch._neg_view(t), ValueError, "lazily negated"),
        (
            lambda t: torch.frombuffer(bytearray(4 * t.numel() + 2), dtype=torch.float32, offset=2),
            ValueError,
            "not aligned",
        ),
        (lambda t: t.to(torch.uint16), ValueError, "torch.uint16 is not one native_cpu takes"),
    ],
    ids=["address", "descriptor-tuple", "capsule", "numpy", "meta", "sparse", "neg-view", "misaligned", "uint16"],
)
def test_what_is_not_a_readable_cpu_tensor_is_refused(reader: str, make: object, error: type, match: str) -> None:
    t = torch.randn(6)
    with pytest.raises(error, match=match):
        _native.validate_tensor(make(t))  # type: ignore[operator]


def test_subclasses_and_tensors_that_need_grad_are_read(reader: str) -> None:
    class Sub(torch.Tensor):
        pass

    p = torch.nn.Parameter(torch.randn(3, 4))
    assert _native.validate_tensor(p) == 12
    assert _native.validate_tensor(torch.randn(5).as_subclass(Sub)) == 5


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    bad=st.sampled_from(["stride", "dtype", "shape", "rank", "overlap", "count", "address", "meta", "small_out"]),
)
def test_mismatched_calls_raise(reader: str, sizes: list[int], bad: str) -> None:
    x = torch.randn(sizes)
    ex = _native.Executor(_copy_spec(list(x.shape), list(x.stride())))
    out = torch.empty(sizes)
    ins: list[object] = [x]
    outs: list[object] = [out]
    if bad == "stride":
        if all(s <= 1 for s in sizes):
            return  # a stride over a dim of size 0 or 1 is free
        ins = [torch.randn(x.numel() * 3 + 8).as_strided(x.shape, [s * 2 + 1 for s in x.stride()])]
    elif bad == "dtype":
        ins = [x.to(torch.int64)]
    elif bad == "shape":
        ins = [torch.randn([s + 1 for s in sizes])]
    elif bad == "rank":
        ins = [x.unsqueeze(-1)]
    elif bad == "overlap":
        if x.numel() == 0:
            return
        outs = [x]
    elif bad == "count":
        ins = ins * 2
    elif bad == "address":
        ins = [x.data_ptr()]
    elif bad == "meta":
        outs = [torch.empty(sizes, device="meta")]
    elif bad == "small_out":
        if x.numel() == 0:
            return
        outs = [torch.empty(x.numel() - 1)]
    with pytest.raises(TypeError if bad == "address" else ValueError):
        ex.run(ins, outs)


def test_size_one_dims_may_carry_any_stride(reader: str) -> None:
    ex = _native.Executor(_copy_spec([1, 5], [5, 1]))
    x = torch.randn(40).as_strided((1, 5), (17, 1))
    out = torch.empty(1, 5)
    ex.run([x], [out])
    assert torch.equal(out, x)


@pytest.mark.parametrize("bad", ["count_in", "count_out", "misaligned", "overlap_in", "overlap_out", "self_overlap"])
def test_outputs_are_checked(reader: str, bad: str) -> None:
    x = torch.randn(4, 5)
    ex = _native.Executor(_copy_spec([4, 5], [5, 1], outputs=2))
    o1, o2 = torch.empty(4, 5), torch.empty(4, 5)
    ex.run([x], [o1, o2])
    assert torch.equal(o1, x) and torch.equal(o2, x)
    ins: list[torch.Tensor] = [x]
    outs: list[torch.Tensor] = [o1, o2]
    if bad == "count_in":
        ins = ins * 2
    elif bad == "count_out":
        outs = outs[:1]
    elif bad == "misaligned":
        outs = [torch.frombuffer(bytearray(82), dtype=torch.float32, offset=2).view(4, 5), o2]
    elif bad == "overlap_in":
        big = torch.randn(30)
        ins, outs = [big[:20].view(4, 5)], [big[10:].view(4, 5), o2]
    elif bad == "overlap_out":
        both = torch.empty(39)
        outs = [both[:20].view(4, 5), both[19:].view(4, 5)]
    elif bad == "self_overlap":
        outs = [torch.empty(1).expand(4, 5), o2]
    with pytest.raises(ValueError):
        ex.run(ins, outs)


def _transposed_copy_spec(declare: bool) -> str:
    """A copy of a (4, 5) input into an output buffer the plan writes column-major; ``declare``:
    the buffer carries that layout (as the lowering writes it), else only its element count."""
    spec = json.loads(_copy_spec([4, 5], [5, 1]))
    spec["values"][1]["strides"] = [1, 4]
    if declare:
        spec["buffers"][1].update(sizes=[4, 5], strides=[1, 4])
    return json.dumps(spec)


def test_an_output_in_another_layout_than_the_plan_writes_is_refused(reader: str) -> None:
    x = torch.randn(4, 5)
    flat = _native.Executor(_copy_spec([4, 5], [5, 1]))
    for bad in (torch.empty(5, 4).t(), torch.empty(21), torch.empty(40)[::2].view(4, 5)):
        with pytest.raises(ValueError, match="contiguous elements"):
            flat.run([x], [bad])
    out = torch.empty(2, 10)  # any contiguous shape of the buffer's elements
    flat.run([x], [out])
    assert torch.equal(out.view(4, 5), x)
    declared = _native.Executor(_transposed_copy_spec(declare=True))
    with pytest.raises(ValueError, match=r"output 1: sizes \[4, 5\] strides \[5, 1\] differ from the plan's"):
        declared.run([x], [torch.empty(4, 5)])
    out = torch.empty(5, 4).t()
    declared.run([x], [out])
    assert torch.equal(out, x)  # written column-major, read back as the plan's values


def test_an_output_layout_that_does_not_span_its_buffer_is_refused() -> None:
    spec = json.loads(_transposed_copy_spec(declare=True))
    spec["buffers"][1]["strides"] = [1, 5]
    with pytest.raises(ValueError, match="does not span its 20 elements"):
        _native.Executor(json.dumps(spec))


def test_the_kv_cache_holds_its_tensors() -> None:
    k, v = torch.zeros(1, 1, 8, 4), torch.zeros(1, 1, 8, 4)
    alive = weakref.ref(k)
    cache = _native.LLMKVCache([k], [v])
    del k
    gc.collect()
    assert alive() is not None, "LLMKVCache let a tensor it writes through be freed"
    del cache
    gc.collect()
    assert alive() is None


def test_the_openmp_runtime_is_looked_up_in_a_loaded_library() -> None:
    with pytest.raises(ValueError, match="not a library this process has loaded"):
        _native.set_openmp("/nonexistent/libgomp.so.1")
    with pytest.raises(ValueError, match="no GOMP_parallel"):
        _native.set_openmp("libc.so.6")
    with pytest.raises(ValueError, match="NUL"):
        _native.set_openmp("lib\x00gomp")
    with pytest.raises(TypeError):
        _native.set_openmp(12345)  # type: ignore[arg-type]
    if "OpenMP" in torch.__config__.parallel_info():
        assert use_torch_openmp() == "openmp"


def test_reader_names_are_checked() -> None:
    with pytest.raises(ValueError, match="exchange"):
        _native._dlpack_reader("numpy")


@settings(max_examples=60, deadline=None)
@given(
    offset=st.integers(0, 40),
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    strides=st.lists(st.integers(0, 9), min_size=1, max_size=3),
)
def test_views_outside_their_buffer_are_rejected(offset: int, sizes: list[int], strides: list[int]) -> None:
    strides = (strides * 3)[: len(sizes)]
    spec = json.loads(_copy_spec([8], [1]))
    spec["values"][0] = {"buf": 0, "offset": offset, "sizes": sizes, "strides": strides}
    spec["values"][1] = {"buf": 1, "offset": 0, "sizes": sizes, "strides": strides}
    spec["buffers"][1]["numel"] = 1000
    extent = 0 if 0 in sizes else 1 + sum((s - 1) * t for s, t in zip(sizes, strides))
    if extent and offset + extent > 8:
        with pytest.raises(ValueError):
            _native.Executor(json.dumps(spec))
    else:
        _native.Executor(json.dumps(spec))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s["steps"][0].update(op="gemm"),
        lambda s: s["steps"][0].update(ins=[7]),
        lambda s: s["steps"][0].update(outs=[0]),
        lambda s: s["steps"][0]["prog"].insert(0, {"op": "exp", "dst": 1, "a": [9]}),
        lambda s: s["buffers"][0].update(dtype="float64"),
        lambda s: s["buffers"][0].update(kind="weird"),
        lambda s: s.update(steps="nope"),
    ],
)
def test_malformed_specs_are_errors(mutate: object) -> None:
    spec = json.loads(_copy_spec([2, 3], [3, 1]))
    mutate(spec)  # type: ignore[operator]
    with pytest.raises(ValueError):
        _native.Executor(json.dumps(spec))


def test_out_of_range_embedding_index_is_an_error() -> None:
    import torch.nn.functional as F

    from torchburn.testing.conformance import compile_with

    fn, _ = compile_with("native_cpu", F.embedding)
    with pytest.raises(Exception, match="out of range"):
        fn(torch.tensor([0, 12]), torch.randn(10, 4))


def test_info_functions() -> None:
    assert _native.isa() in {"avx512", "avx2+fma", "sse2", "scalar"}
    assert _native.num_threads() >= 1
    before = _native.gemm_backend()
    _native.set_gemm_backend("matrixmultiply")
    assert _native.gemm_backend() == "matrixmultiply"
    _native.set_gemm_backend(before)
    with pytest.raises(ValueError):
        _native.set_gemm_backend("blas")
