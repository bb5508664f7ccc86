"""Every public entry of ``tb_cpu_rust._native`` fed bad arguments: integers and old-style
descriptor tuples where tensors go, wrong dtypes and ranks, non-contiguous, self-overlapping and
aliasing views, empty, 0-d, meta, sparse, lazily negated and misaligned tensors, negative and
huge sizes and strides, bad counts and names. Each must end in a Python exception (or, where the
argument is still valid, a normal return), never a crash.

The fuzzing runs in a child Python (this file run as a script, once per DLPack reader), so a
segfault fails the test with the child's faulthandler trace instead of killing pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native
from tb_cpu_rust.threads import _mapped_libgomp

ERRORS = (ValueError, TypeError, RuntimeError, OverflowError)
"""What a refused call may raise (OverflowError: a negative or huge Python int for a size)."""

F32, I64 = torch.float32, torch.int64
OTHER_DTYPES = [
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.uint16,
    torch.float8_e4m3fn,
    torch.float32,
]
_ODD_DTYPES = (torch.uint16, torch.float8_e4m3fn)  # no conversion from every dtype: made as zeros
try:
    import numpy  # noqa: F401

    _NUMPY = True
except ImportError:  # pragma: no cover - torch without numpy
    _NUMPY = False


@dataclass
class Slot:
    """A tensor argument: where it sits in the call and what the entry needs of it."""

    path: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...] = (F32,)  # () = any dtype
    rank: int | None = None
    layout: str = "contiguous"  # or "strided", or "rows" (any strides, the last one 1)
    out: bool = False  # written by the entry: no other tensor of the call may share its memory
    optional: bool = False
    strict: bool = False  # any other shape or layout must be refused (an executor input)
    may_alias: bool = False  # the entry works in place when handed the same tensor twice


@dataclass
class Call:
    fn: Callable[..., Any]
    args: list[Any]
    slots: list[Slot] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # positions of ints that count or index things
    names: list[int] = field(default_factory=list)  # positions of strings that name a choice
    lists: list[int] = field(default_factory=list)  # positions of tensor lists whose length matters
    lenient: tuple[Any, ...] = ()  # bad-looking names the entry may still accept
    no_valid_call: bool = False  # a class made only by other entries: calling it is a TypeError
    after: Callable[[], None] | None = None


def _get(obj: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        obj = obj[i]
    return obj


def _put(obj: Any, path: tuple[int, ...], value: Any) -> Any:
    """A copy of ``obj`` with ``value`` at ``path`` (lists and tuples rebuilt, tensors shared)."""
    if not path:
        return value
    items = list(obj)
    items[path[0]] = _put(items[path[0]], path[1:], value)
    return tuple(items) if isinstance(obj, tuple) else items


# --- valid calls of every entry ---------------------------------------------------------------


def _copy_plan(n: int) -> str:
    """An executor that copies a float32 [n] input into its [n] output."""
    view = {"buf": 0, "offset": 0, "sizes": [n], "strides": [1]}
    return json.dumps(
        {
            "buffers": [
                {"kind": "input", "dtype": "float32", "numel": 0, "sizes": [n], "strides": [1]},
                {"kind": "output", "dtype": "float32", "numel": n},
            ],
            "values": [view, {**view, "buf": 1}],
            "steps": [
                {
                    "op": "ew",
                    "compute": "f32",
                    "ins": [0],
                    "outs": [1],
                    "prog": [{"op": "load", "dst": 0, "a": [0]}, {"op": "store", "dst": 0, "a": [0]}],
                }
            ],
        }
    )


def _weight(n: int, k: int) -> Any:
    return _native.llm_pack_dense(torch.randn(n, k))


H, HEADS, KV, D, INTER, VOCAB, B, T, CAP = 8, 2, 1, 4, 16, 10, 1, 2, 8


def _model() -> Any:
    def lin(n: int, k: int) -> tuple[Any, None]:
        return (_weight(n, k), None)

    layer = (
        torch.ones(H),
        torch.ones(H),
        None,
        None,
        [lin(H, H), lin(D, H), lin(D, H)],
        lin(H, H),
        None,
        None,
        [lin(INTER, H), lin(INTER, H)],
        lin(H, INTER),
        False,
    )
    config = (H, HEADS, KV, D, INTER, VOCAB, 1e-6, 0.0, 0.5, None, None, None)
    return config, "silu", None, [layer], torch.ones(H), _weight(VOCAB, H)


def _cache() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [torch.zeros(B, KV, CAP, D)], [torch.zeros(B, KV, CAP, D)]


def _adam() -> Call:
    p, g = torch.randn(3, 2), torch.randn(3, 2)
    lists = [[p], [g], [torch.zeros(3, 2)], [torch.zeros(3, 2)], [], [torch.tensor(0.0)]]
    slots = [Slot((i, 0), out=i != 1) for i in range(4)] + [Slot((5, 0), dtypes=(F32, torch.float64), out=True)]
    return Call(
        _native.optim_adam, [*lists, 1e-3, 0.9, 0.999, 1e-8, 0.0, False, False, False], slots, lists=[0, 1, 2, 3, 5]
    )


def _sgd() -> Call:
    lists = [[torch.randn(4)], [torch.randn(4)], [torch.zeros(4)], [True]]
    return Call(
        _native.optim_sgd,
        [*lists, 0.1, 0.9, 0.0, 0.0, False, False],
        [Slot((i, 0), out=i != 1) for i in range(3)],
        lists=[0, 1, 2, 3],
    )


def _step() -> Call:
    k, v = _cache()
    cache = _native.LLMKVCache(k, v)
    cos, sin = torch.ones(B, T, D), torch.zeros(B, T, D)
    args = [
        torch.randn(B * T, H),
        torch.arange(T).view(B, T),
        cos,
        sin,
        torch.arange(CAP).view(B, CAP),
        0,
        cache,
        torch.empty(B, VOCAB),
        True,
    ]
    slots = [
        Slot((0,), rank=2, out=True),
        Slot((1,), dtypes=(I64,), rank=2),
        Slot((2,), rank=3),
        Slot((3,), rank=3),
        Slot((4,), dtypes=(I64,), rank=2),
        Slot((7,), rank=2, out=True),
    ]
    return Call(_native.LLMModel(*_model()).step, args, slots, sizes=[5])


def _attention() -> Call:
    q, kk, vv = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    args = [q, kk, vv, mask, torch.empty(1, 2, 3, 4), 0.5]
    slots = [Slot((i,), rank=4, layout="rows") for i in range(3)]
    slots += [Slot((3,), dtypes=(torch.bool,), rank=4), Slot((4,), rank=4, out=True)]
    return Call(_native.llm_attention, args, slots)


def _rope() -> Call:
    x, cos, sin = torch.randn(1, 2, 3, 4), torch.ones(1, 1, 3, 4), torch.zeros(1, 1, 3, 4)
    slots = [Slot((i,), rank=4, layout="rows") for i in range(3)] + [Slot((3,), rank=4, out=True)]
    return Call(_native.llm_rope, [x, cos, sin, torch.empty(1, 2, 3, 4)], slots)


def _quantize_layout() -> Call:
    args = [torch.randn(4, 64), "int4", 32, torch.empty(4, 32, dtype=torch.uint8), torch.empty(4, 2), torch.empty(4, 2)]
    slots = [
        Slot((0,), dtypes=(F32, torch.bfloat16), rank=2),
        Slot((3,), dtypes=(torch.uint8,), rank=2, out=True),
        Slot((4,), rank=2, out=True),
        Slot((5,), rank=2, out=True),
    ]
    return Call(_native.llm_quantize_layout, args, slots, sizes=[2], names=[1])


def _restoring(fn: Callable[[Any], Any], current: Callable[[], Any], lenient: tuple[Any, ...] = ()) -> Call:
    before = current()
    return Call(fn, [before], names=[0], after=lambda: fn(before), lenient=lenient)


def _openmp() -> Call:
    path = _mapped_libgomp()
    assert path is not None, "torch here runs on libgomp: the OpenMP entry needs its path"
    # "": the main program's symbol scope, which may find the same runtime
    return Call(_native.set_openmp, [path], names=[0], lenient=("",))


def _packed_linear() -> Call:
    w = _weight(6, 4)
    slots = [Slot((0,), rank=2), Slot((1,), rank=2, out=True), Slot((2,), rank=1, optional=True)]
    return Call(w.linear, [torch.randn(3, 4), torch.empty(3, 6), torch.randn(6)], slots)


def _packed_rows() -> Call:
    w = _weight(6, 4)
    return Call(
        w.rows,
        [torch.tensor([0, 5, 2]), torch.empty(3, 4)],
        [Slot((0,), dtypes=(I64,), rank=1), Slot((1,), rank=2, out=True)],
    )


def _run(method: str) -> Call:
    ex = _native.Executor(_copy_plan(6))
    slots = [Slot((0, 0), strict=True), Slot((1, 0), layout="strided", out=True)]
    return Call(getattr(ex, method), [[torch.randn(6)], [torch.empty(6)]], slots, lists=[0, 1])


def _getter(make: Callable[[], Any], name: str) -> Call:
    return Call(lambda: getattr(make(), name), [])


def _int4() -> list[Any]:
    return [torch.randint(0, 255, (4, 16), dtype=torch.uint8), torch.ones(4, 1), torch.zeros(4, 1), 32]


CASES: dict[str, Callable[[], Call]] = {
    "validate_tensor": lambda: Call(
        _native.validate_tensor, [torch.randn(3, 4)], [Slot((0,), dtypes=(), layout="strided")]
    ),
    "unary_f32": lambda: Call(
        _native.unary_f32,
        [0, torch.randn(5), torch.empty(5)],
        [Slot((1,)), Slot((2,), out=True, may_alias=True)],
        sizes=[0],
    ),
    "unary_ops": lambda: Call(_native.unary_ops, []),
    "isa": lambda: Call(_native.isa, []),
    "fma_peak_gflops": lambda: Call(_native.fma_peak_gflops, [1, 0.001]),  # its bounds: test_fma_peak.py
    "gemm_backend": lambda: Call(_native.gemm_backend, []),
    "set_gemm_backend": lambda: _restoring(_native.set_gemm_backend, _native.gemm_backend),
    "num_threads": lambda: Call(_native.num_threads, []),
    "thread_pool": lambda: Call(_native.thread_pool, []),
    "set_thread_pool": lambda: _restoring(_native.set_thread_pool, _native.thread_pool),
    "set_openmp": _openmp,
    "Executor": lambda: Call(_native.Executor, [_copy_plan(3)], names=[0]),
    "Executor.run": lambda: _run("run"),
    "Executor.run_ptrs": lambda: _run("run_ptrs"),
    "Executor.run_profiled": lambda: _run("run_profiled"),
    "Executor.n_inputs": lambda: _getter(lambda: _native.Executor(_copy_plan(2)), "n_inputs"),
    "Executor.n_outputs": lambda: _getter(lambda: _native.Executor(_copy_plan(2)), "n_outputs"),
    "Executor.n_steps": lambda: _getter(lambda: _native.Executor(_copy_plan(2)), "n_steps"),
    "llm_isa": lambda: Call(_native.llm_isa, []),
    "llm_prefill_tiles": lambda: Call(_native.llm_prefill_tiles, []),
    "llm_prefill_engine_gemm": lambda: Call(_native.llm_prefill_engine_gemm, []),
    "llm_prefill_bf16_pairs": lambda: Call(_native.llm_prefill_bf16_pairs, []),
    "llm_release_free_memory": lambda: Call(_native.llm_release_free_memory, []),
    "llm_pack_dense": lambda: Call(
        _native.llm_pack_dense, [torch.randn(3, 4)], [Slot((0,), dtypes=(F32, torch.bfloat16), rank=2)]
    ),
    "llm_pack_int8": lambda: Call(
        _native.llm_pack_int8,
        [torch.randint(-127, 127, (3, 4), dtype=torch.int8), torch.ones(3)],
        [Slot((0,), dtypes=(torch.int8,), rank=2), Slot((1,), rank=1)],
    ),
    "llm_pack_int4": lambda: Call(
        _native.llm_pack_int4,
        _int4(),
        [Slot((0,), dtypes=(torch.uint8,), rank=2), Slot((1,), rank=2), Slot((2,), rank=2)],
        sizes=[3],
    ),
    "llm_quantize": lambda: Call(
        _native.llm_quantize,
        [torch.randn(4, 64), "int4", 32],
        [Slot((0,), dtypes=(F32, torch.bfloat16), rank=2)],
        sizes=[2],
        names=[1],
    ),
    "llm_quantize_layout": _quantize_layout,
    "llm_rms_norm": lambda: Call(
        _native.llm_rms_norm,
        [torch.randn(3, 8), torch.ones(8), torch.empty(3, 8), 1e-6, 0.0],
        [Slot((0,), rank=2), Slot((1,), rank=1), Slot((2,), rank=2, out=True)],
    ),
    "llm_gated_act": lambda: Call(
        _native.llm_gated_act,
        [torch.randn(3, 8), torch.randn(3, 8), torch.empty(3, 8), "silu"],
        [Slot((0,), rank=2), Slot((1,), rank=2), Slot((2,), rank=2, out=True)],
        names=[3],
    ),
    "llm_rope": _rope,
    "llm_attention": _attention,
    "LLMWeight": lambda: Call(_native.LLMWeight, [torch.randn(3, 4)], no_valid_call=True),
    "LLMWeight.linear": _packed_linear,
    "LLMWeight.rows": _packed_rows,
    "LLMWeight.shape": lambda: _getter(lambda: _weight(3, 4), "shape"),
    "LLMWeight.kind": lambda: _getter(lambda: _weight(3, 4), "kind"),
    "LLMWeight.nbytes": lambda: _getter(lambda: _weight(3, 4), "nbytes"),
    "LLMKVCache": lambda: Call(
        _native.LLMKVCache, [*_cache()], [Slot((0, 0), rank=4, out=True), Slot((1, 0), rank=4, out=True)], lists=[0, 1]
    ),
    "LLMModel": lambda: Call(
        _native.LLMModel,
        list(_model()),
        [Slot((3, 0, 0), rank=1), Slot((3, 0, 1), rank=1), Slot((4,), rank=1)],
        names=[1],
    ),
    "LLMModel.step": _step,
    "LLMModel.num_layers": lambda: _getter(lambda: _native.LLMModel(*_model()), "num_layers"),
    "optim_adam": _adam,
    "optim_sgd": _sgd,
    "_dlpack_reader": lambda: _restoring(_native._dlpack_reader, _native._dlpack_reader, lenient=(None,)),
}


def public_entries() -> set[str]:
    """Every function and class of ``_native`` and every public attribute its classes define."""
    names = set()
    for name in dir(_native):
        obj = getattr(_native, name)
        if name.startswith("__") or not callable(obj):
            continue
        names.add(name)
        if isinstance(obj, type):
            names |= {f"{name}.{attr}" for attr in vars(obj) if not attr.startswith("_")}
    return names


# --- bad arguments --------------------------------------------------------------------------


class _Sub(torch.Tensor):
    pass


def _strided_copy(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t`` in a view whose last dim steps by two elements."""
    base = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    view = base[..., ::2]
    view.copy_(t)
    return view


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in memory one byte past an address aligned for its dtype."""
    raw = bytearray(t.element_size() * t.numel() + 1)
    moved = torch.frombuffer(raw, dtype=t.dtype, count=t.numel(), offset=1).view(t.shape)
    moved.copy_(t)
    _KEEP.append(raw)
    return moved


_KEEP: list[Any] = []


def _not_tensors(t: torch.Tensor) -> list[Any]:
    """What a caller might wrongly pass for ``t``: addresses, the old descriptor tuple, others."""
    addr = t.data_ptr()
    return [
        0,
        1,
        -1,
        2**64,
        2**63 - 1,
        addr,
        addr + 1,
        (addr, tuple(t.shape), t.stride(), str(t.dtype)),
        "tensor",
        1.5,
        [t],
        object(),
        b"\x00" * 8,
        torch.float32,
        torch._C._to_dlpack(t),
        t.numpy() if _NUMPY else 0,
    ]


def _bad_tensors(t: torch.Tensor, slot: Slot, call: Call) -> list[tuple[Any, bool]]:
    """(replacement, whether the entry must refuse it) for the tensor ``t`` at ``slot``."""
    layout_fixed = slot.layout == "contiguous" or slot.strict
    out: list[tuple[Any, bool]] = [(v, True) for v in _not_tensors(t)]
    if not slot.optional:
        out.append((None, True))
    for dt in OTHER_DTYPES:
        if dt is not t.dtype:
            other = torch.zeros(t.shape, dtype=dt) if dt in _ODD_DTYPES else t.to(dt)
            out.append((other, bool(slot.dtypes) and dt not in slot.dtypes))
    ranked = slot.rank is not None or slot.strict
    out += [(t.unsqueeze(0), ranked), (torch.zeros((), dtype=t.dtype), ranked)]
    out += [(t.reshape(-1) if t.dim() != 1 else t.reshape(1, -1), slot.rank is not None)]
    out.append((torch.empty(t.shape, dtype=t.dtype, device="meta"), True))
    if t.dtype.is_floating_point:
        out += [(torch._neg_view(t), True), (t.clone().requires_grad_(), False)]
    out.append((t.clone().as_subclass(_Sub), False))
    if t.dim() >= 1:
        out.append((t.to_sparse(), True))
        empty = (0, *t.shape[1:])
        out.append((torch.empty(empty, dtype=t.dtype), slot.strict))
        out.append((torch.empty(0, dtype=t.dtype).as_strided(empty, [2**60] * t.dim()), slot.strict))
        out.append((torch.empty(1, dtype=t.dtype).as_strided([1] * t.dim(), [2**62] * t.dim()), False))
        if t.shape[-1] > 1:
            out.append((_strided_copy(t), layout_fixed or slot.layout == "rows"))
    if any(s > 1 for s in t.shape):
        first = t[tuple(slice(0, 1) for _ in t.shape)]
        out.append((first.expand(t.shape), layout_fixed or slot.out))
    if t.numel() and t.element_size() > 1:
        out.append((_misaligned(t), True))
    if t.dtype is I64:
        out += [(torch.full_like(t, -1), False), (torch.full_like(t, 2**62), False)]
    # another tensor of the call in the place of this one, where either of them is written
    for other in call.slots:
        src = _get(call.args, other.path)
        aliasing = (slot.out or other.out) and other is not slot and not (slot.may_alias or other.may_alias)
        if aliasing and isinstance(src, torch.Tensor) and src.dtype is t.dtype and src.shape == t.shape and src.numel():
            out.append((src, True))
    return out


def _expect(call: Call, args: list[Any], refuse: bool, what: str) -> None:
    try:
        call.fn(*args)
    except ERRORS:
        return
    finally:
        if call.after is not None:
            call.after()
    assert not refuse, f"{what}: accepted"


def fuzz(name: str, examples: int) -> None:
    """Hypothesis over the bad arguments of one entry (run in the child)."""
    make = CASES[name]
    base = make()
    if base.no_valid_call:
        with pytest.raises(TypeError):
            base.fn(*base.args)
    else:
        base.fn(*base.args)  # the valid call works, so each refusal below is about the bad argument
    if base.after is not None:
        base.after()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        call = make()
        kinds = ["extra_arg"] + ["tensor"] * (3 * bool(call.slots)) + ["size"] * bool(call.sizes)
        kinds += ["name"] * bool(call.names) + ["count"] * bool(call.lists)
        kind = data.draw(st.sampled_from(kinds), label="kind")
        if kind == "extra_arg":
            _expect(call, [*call.args, torch.randn(2), 7], True, f"{name} with extra arguments")
        elif kind == "tensor":
            slot = data.draw(st.sampled_from(call.slots), label="slot")
            t = _get(call.args, slot.path)
            value, refuse = data.draw(st.sampled_from(_bad_tensors(t, slot, call)), label="value")
            _expect(call, _put(call.args, slot.path, value), refuse, f"{name} {slot.path} = {value!r:.80}")
        elif kind == "size":
            pos = data.draw(st.sampled_from(call.sizes), label="pos")
            value = data.draw(
                st.sampled_from([-1, -(2**63), 2**64, 2**63, 2**62, 10**6, 99, 0, 3, 1.5, "1", None]), label="size"
            )
            _expect(call, _put(call.args, (pos,), value), value not in (0, 3), f"{name} arg {pos} = {value!r}")
        elif kind == "name":
            pos = data.draw(st.sampled_from(call.names), label="pos")
            value = data.draw(st.sampled_from(["", "nonsense", "\x00", "x" * 10_000, 3, None, b"silu"]), label="name")
            refuse = not any(value is v or value == v for v in call.lenient)
            _expect(call, _put(call.args, (pos,), value), refuse, f"{name} arg {pos} = {value!r:.40}")
        else:
            pos = data.draw(st.sampled_from(call.lists), label="pos")
            items = list(call.args[pos])
            value = data.draw(st.sampled_from([items + items, items[:-1], [], "abc", 5]), label="list")
            refuse = value != items
            _expect(call, _put(call.args, (pos,), value), refuse, f"{name} list {pos} = {value!r:.80}")

    one()


def _child(reader: str, examples: int) -> None:
    import faulthandler

    faulthandler.enable()
    _native._dlpack_reader(reader)
    for name in sorted(CASES):
        print(f"entry {name}", flush=True)
        fuzz(name, examples)
        _native._dlpack_reader(reader)  # the _dlpack_reader case switches it
    print(f"fuzzed {len(CASES)} entries", flush=True)


# --- tests ------------------------------------------------------------------------------------


def test_every_public_entry_is_fuzzed() -> None:
    missing = public_entries() - set(CASES)
    assert not missing, f"entries of _native with no fuzz case in CASES: {sorted(missing)}"
    stale = set(CASES) - public_entries()
    assert not stale, f"fuzz cases for entries _native no longer has: {sorted(stale)}"


@pytest.mark.parametrize("reader", ["exchange", "capsule"])
def test_bad_arguments_are_exceptions_never_crashes(reader: str) -> None:
    if reader == "exchange" and _native._dlpack_reader() != "exchange":
        pytest.xfail(reason=f"torch {torch.__version__} has no DLPack exchange API")  # only older torch
    proc = subprocess.run(
        [sys.executable, __file__, reader, "30"], capture_output=True, text=True, timeout=900, check=False
    )
    tail = (proc.stdout[-2000:] + proc.stderr[-6000:]).strip()
    assert proc.returncode == 0, f"the fuzzing child died with {proc.returncode}:\n{tail}"
    assert f"fuzzed {len(CASES)} entries" in proc.stdout, tail


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
