"""Property tests at the FFI boundary: bad sizes, strides, dtypes, pointers and overlapping
outputs are Python exceptions, never a crash."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native

DTYPES = ["float32", "int64", "bool"]


def _copy_spec(sizes: list[int], strides: list[int], dtype: str = "float32") -> str:
    """A one-step plan: copy an input of the given layout into a contiguous output."""
    numel = 1
    for s in sizes:
        numel *= s
    out_strides = []
    acc = 1
    for s in reversed(sizes):
        out_strides.insert(0, acc)
        acc *= max(s, 1)
    compute = "f32" if dtype == "float32" else "i64"
    return json.dumps({
        "buffers": [
            {"kind": "input", "dtype": dtype, "numel": 0, "sizes": sizes, "strides": strides},
            {"kind": "output", "dtype": dtype, "numel": numel},
        ],
        "values": [
            {"buf": 0, "offset": 0, "sizes": sizes, "strides": strides},
            {"buf": 1, "offset": 0, "sizes": sizes, "strides": out_strides},
        ],
        "steps": [{
            "op": "ew", "compute": compute, "ins": [0], "outs": [1],
            "prog": [{"op": "load", "dst": 0, "a": [0]}, {"op": "store", "dst": 0, "a": [0]}],
        }],
    })


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, data=st.data())
def test_any_valid_layout_round_trips(shape: list[int], data: st.DataObject) -> None:
    base = torch.randn(*[s + 2 for s in shape]) if shape else torch.randn(())
    # a random strided window: slicing with steps gives arbitrary non-negative strides
    steps = [data.draw(st.integers(1, 2)) for _ in shape]
    x = base[tuple(slice(0, s * k, k) for s, k in zip(shape, steps))] if shape else base
    x = x[tuple(slice(0, s) for s in shape)] if shape else x
    if data.draw(st.booleans()) and x.dim() >= 2:
        x = x.transpose(0, 1)
    sizes, strides = list(x.shape), list(x.stride())
    ex = _native.Executor(_copy_spec(sizes, strides))
    out = torch.empty(x.shape)
    ex.run([(x.data_ptr(), sizes, strides, "float32")], [(out.data_ptr(), sizes, list(out.stride()), "float32")])
    assert torch.equal(out, x)


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(-3, 2**62), min_size=0, max_size=4),
    strides=st.lists(st.integers(-3, 2**62), min_size=0, max_size=4),
    dtype=st.sampled_from([*DTYPES, "float16", "complex64", "complex256", "nonsense"]),
    ptr=st.sampled_from([0, 1, 3, 4096]),
)
def test_validate_tensor_never_crashes(sizes: list[int], strides: list[int], dtype: str, ptr: int) -> None:
    try:
        ext = _native.validate_tensor(ptr, sizes, strides, dtype)
    except ValueError:
        return
    assert ext >= 0
    assert all(s >= 0 for s in sizes) and all(s >= 0 for s in strides) and len(sizes) == len(strides)
    # float16 is a storage-only dtype (copies and fills); complex64 is carried for complex.rs / fft.rs
    assert dtype in [*DTYPES, "float16", "complex64"]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    bad=st.sampled_from(["stride", "dtype", "shape", "rank", "negative", "overlap", "count"]),
)
def test_mismatched_calls_raise(sizes: list[int], bad: str) -> None:
    x = torch.randn(sizes)
    ex = _native.Executor(_copy_spec(list(x.shape), list(x.stride())))
    out = torch.empty(sizes)
    ins = [(x.data_ptr(), list(x.shape), list(x.stride()), "float32")]
    outs = [(out.data_ptr(), list(out.shape), list(out.stride()), "float32")]
    if bad == "stride":
        ins = [(x.data_ptr(), list(x.shape), [s + 1 for s in x.stride()], "float32")]
    elif bad == "dtype":
        ins = [(x.data_ptr(), list(x.shape), list(x.stride()), "int64")]
    elif bad == "shape":
        ins = [(x.data_ptr(), [s + 1 for s in x.shape], list(x.stride()), "float32")]
    elif bad == "rank":
        ins = [(x.data_ptr(), [*x.shape, 1], list(x.stride()), "float32")]
    elif bad == "negative":
        outs = [(out.data_ptr(), list(out.shape), [-1] * out.dim(), "float32")]
    elif bad == "overlap":
        if x.numel() == 0:
            return
        outs = [(x.data_ptr(), list(x.shape), list(x.stride()), "float32")]
    elif bad == "count":
        ins = ins * 2
    with pytest.raises(ValueError):
        ex.run(ins, outs)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, data=st.data())
def test_run_ptrs_agrees_with_run(shape: list[int], data: st.DataObject) -> None:
    """The pointer entry runs the same program as the descriptor entry, on the same memory."""
    base = torch.randn(*[s + 2 for s in shape]) if shape else torch.randn(())
    x = base[tuple(slice(1, 1 + s) for s in shape)] if shape else base
    if data.draw(st.booleans()) and x.dim() >= 2:
        x = x.transpose(0, 1)
    sizes, strides = list(x.shape), list(x.stride())
    ex = _native.Executor(_copy_spec(sizes, strides))
    a, b = torch.full(x.shape, -1.0), torch.full(x.shape, -2.0)
    ex.run([(x.data_ptr(), sizes, strides, "float32")], [(a.data_ptr(), sizes, list(a.stride()), "float32")])
    ex.run_ptrs([x.data_ptr()], [b.data_ptr()])
    assert torch.equal(a, x) and torch.equal(b, x)


@pytest.mark.parametrize("bad", ["count_in", "count_out", "null", "misaligned", "overlap_in", "overlap_out"])
def test_run_ptrs_checks_the_pointers(bad: str) -> None:
    x = torch.randn(4, 5)
    spec = json.loads(_copy_spec([4, 5], [5, 1]))
    spec["buffers"].insert(2, dict(spec["buffers"][1]))  # a second output, the same copy
    spec["values"].append({"buf": 2, "offset": 0, "sizes": [4, 5], "strides": [5, 1]})
    spec["steps"].append({**spec["steps"][0], "outs": [2]})
    ex = _native.Executor(json.dumps(spec))
    o1, o2 = torch.empty(4, 5), torch.empty(4, 5)
    ex.run_ptrs([x.data_ptr()], [o1.data_ptr(), o2.data_ptr()])
    assert torch.equal(o1, x) and torch.equal(o2, x)
    ins, outs = [x.data_ptr()], [o1.data_ptr(), o2.data_ptr()]
    if bad == "count_in":
        ins = ins * 2
    elif bad == "count_out":
        outs = outs[:1]
    elif bad == "null":
        ins = [0]
    elif bad == "misaligned":
        outs = [o1.data_ptr() + 2, o2.data_ptr()]
    elif bad == "overlap_in":
        outs = [x.data_ptr() + 4 * 7, o2.data_ptr()]
    elif bad == "overlap_out":
        outs = [o1.data_ptr(), o1.data_ptr() + 4 * 19]
    with pytest.raises(ValueError):
        ex.run_ptrs(ins, outs)


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
