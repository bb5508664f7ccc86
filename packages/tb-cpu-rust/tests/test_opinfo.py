"""PyTorch's OpInfo database against native_cpu: the float32 coverage gate.

For every op of ``torch.testing._internal.common_methods_invocations.op_db`` that supports float32
on CPU, the first ``SAMPLES_PER_OP`` float32 samples (``op.sample_inputs("cpu", torch.float32)``,
a deterministic prefix: the CI budget does not allow all ~19k samples) are each turned into a
function of their tensor arguments and put through tb-core's compile path with only native_cpu in
force: the function is traced to ATen with tb-core's own decomposition table (Core ATen minus the
ops tb-core keeps whole) and handed to ``torchburn.partition.compile_graph`` with
``min_partition_size=0`` (so a graph of view ops alone is native_cpu's too: its outputs are views of
the inputs whose sizes, strides and offsets the lowering worked out at compile time), the function the
``"torchburn"`` backend calls on every AOTAutograd graph. Tracing with ``make_fx`` instead of
Dynamo + AOTAutograd is ten times cheaper per sample; ``test_real_backend_agrees`` checks on a
handful of ops that ``torch.compile(..., backend="torchburn")`` with ``TORCHBURN_ENGINE=native_cpu``
reaches the same verdict.

Each sample ends in one bucket:

* excluded: the sample does not make a compilable tensor function (eager raises, tracing raises,
  an input or output is not a dense tensor, the result holds a non-tensor, or the graph holds an op
  whose output shape or value is data-dependent, where Dynamo breaks the graph by default), or its
  result is not comparable (random ops, uninitialised memory). Counted and reported, not in the rate.
* fallback: some ATen node of the graph is not run by native_cpu (refused, below the partition
  threshold, or the engine failed to compile or run its partition).
* mismatch: every node ran natively but the result differs from eager beyond ``RTOL``/``ATOL``
  (integer and bool results must be equal; NaNs must match).
* pass: every node ran natively and the result matches eager.

The gate is ``pass / (fallback + mismatch + pass) >= 0.95``. ``MUST_BE_NATIVE`` names the ops the
model set relies on: every sample of those must pass, whatever the overall rate. The per-op table
is printed with ``-s`` and written to ``$TORCHBURN_OPINFO_REPORT`` when that is set.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import types
import unittest
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

#: first samples of each op that take part (deterministic; the generators are seeded below)
SAMPLES_PER_OP = 5
#: the documented default tolerance: float32 kernels here use their own vectorised transcendental
#: functions and reduction orders, so bit-equality with ATen is not expected
RTOL, ATOL = 1e-4, 1e-5
#: the issue's target for pass / judged (measured: 95.2 %, 2463 of 2587)
PASS_RATE_TARGET = 0.95
#: what CI holds the engine to: the target itself (the samples are a deterministic prefix)
PASS_RATE_FLOOR = 0.95

#: OpInfo names whose results are random or uninitialised memory: not comparable with eager
NOT_COMPARABLE = frozenset(
    {
        "bernoulli",
        "normal",
        "normal.number_mean",
        "uniform",
        "rand_like",
        "randn_like",
        "randint_like",
        "randint",
        "multinomial",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout",
        "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        "nn.functional.gumbel_softmax",
        "svd_lowrank",
        "pca_lowrank",
        "empty",
        "empty_like",
        "new_empty",
        "new_empty_strided",
        "empty_strided",
        "empty_permuted",
    }
)

#: OpInfo names of the ops the model set (torchburn.testing.models) is made of: every judged sample
#: of these must run natively and match, whatever the overall rate. (Pure view ops such as view or
#: transpose are absent: alone in a graph, tb-core keeps them eager; inside a model they are native.)
MUST_BE_NATIVE = (
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "div.trunc_rounding", "neg", "exp", "sqrt",
    "rsqrt", "pow", "where", "mm", "bmm", "addmm", "matmul", "nn.functional.linear", "nn.functional.relu",
    "nn.functional.gelu", "nn.functional.silu", "sigmoid", "tanh", "softmax", "log_softmax",
    "nn.functional.layer_norm", "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "cat",
    "stack", "sum", "mean", "amax", "argmax", "nn.functional.cross_entropy", "nn.functional.nll_loss",
    "nn.functional.scaled_dot_product_attention", "nn.functional.rms_norm", "cumsum", "index_select", "masked_fill",
    "clamp", "var", "logsumexp",
)  # fmt: skip

EXCLUDED, FALLBACK, MISMATCH, PASS = "excluded", "fallback", "mismatch", "pass"
#: a graph made only of view ops that the engine did not take (with ``min_partition_size=0`` tb-core
#: hands such graphs to the engine; left eager, they count as fallbacks here)
VIEWS_ONLY = "views only, left eager"


@dataclass
class Verdict:
    op: str
    bucket: str
    reason: str = ""


@dataclass
class Results:
    verdicts: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> Counter[str]:
        return Counter(v.bucket for v in self.verdicts)

    def rate(self) -> float:
        c = self.counts()
        judged = c[FALLBACK] + c[MISMATCH] + c[PASS]
        return c[PASS] / judged if judged else 0.0

    def table(self) -> str:
        c = self.counts()
        lines = [
            f"OpInfo float32 samples on native_cpu ({SAMPLES_PER_OP} per op at most, {self.seconds:.0f} s): "
            f"pass {c[PASS]}, fallback {c[FALLBACK]}, mismatch {c[MISMATCH]}, excluded {c[EXCLUDED]}; "
            f"pass rate {self.rate():.2%} of {c[FALLBACK] + c[MISMATCH] + c[PASS]} judged samples",
            "",
            f"{'op':40} {'fallback':>8} {'mismatch':>8} {'pass':>5}  first reason",
        ]
        by_op: dict[str, Counter[str]] = {}
        first: dict[str, str] = {}
        for v in self.verdicts:
            by_op.setdefault(v.op, Counter())[v.bucket] += 1
            if v.bucket in (FALLBACK, MISMATCH):
                first.setdefault(v.op, v.reason)
        failing = [(op, n) for op, n in by_op.items() if n[FALLBACK] or n[MISMATCH]]
        failing.sort(key=lambda item: (-(item[1][FALLBACK] + item[1][MISMATCH]), item[0]))
        for op, n in failing:
            lines.append(f"{op:40} {n[FALLBACK]:>8} {n[MISMATCH]:>8} {n[PASS]:>5}  {first[op][:110]}")
        views = sum(1 for v in self.verdicts if v.bucket == FALLBACK and v.reason.startswith(VIEWS_ONLY))
        lines += ["", f"{views} of the {c[FALLBACK]} fallback samples are graphs of view ops only ({VIEWS_ONLY})"]
        excluded = Counter(v.reason for v in self.verdicts if v.bucket == EXCLUDED)
        lines += ["", "excluded samples by reason:"]
        lines += [f"  {n:>5}  {why}" for why, n in excluded.most_common()]
        return "\n".join(lines)


def _import_op_db() -> list[Any]:
    # torch's testing internals import expecttest only for a TestCase base class; expecttest is a
    # PyTorch development dependency that torch wheels do not install.
    if "expecttest" not in sys.modules:
        try:
            import expecttest  # noqa: F401
        except ImportError:
            shim = types.ModuleType("expecttest")
            shim.TestCase = unittest.TestCase  # type: ignore[attr-defined]
            sys.modules["expecttest"] = shim
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return list(op_db)


def _is_dense(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_quantized and type(t) in (torch.Tensor, torch.nn.Parameter)


def _has_data_dependent_op(gm: torch.fx.GraphModule) -> str | None:
    tags = {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output}
    for node in gm.graph.nodes:
        if (
            node.op == "call_function"
            and isinstance(node.target, torch._ops.OpOverload)
            and tags & set(node.target.tags)
        ):
            return str(node.target)
    return None


def _has_random_op(gm: torch.fx.GraphModule) -> bool:
    """A node that draws random numbers (CPU flash attention carries the tag for its dropout)."""
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if torch.Tag.nondeterministic_seeded not in node.target.tags:
            continue
        if node.target is sdpa and not (node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)):
            continue
        return True
    return False


def _has_mutation(gm: torch.fx.GraphModule) -> bool:
    return any(
        node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable
        for node in gm.graph.nodes
    )


class _Harness:
    def __init__(self) -> None:
        from torchburn.backend import decomposition_table
        from torchburn.options import Options, select_engines

        self.decompositions = decomposition_table()
        self.opts = Options.from_user({"engine": "native_cpu", "min_partition_size": 0, "warn": False, "cache": False})
        self.engines = select_engines(self.opts)
        assert [e.name for e in self.engines] == ["native_cpu"]

    def judge(self, op: Any, sample: Any) -> Verdict:
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.utils._pytree import tree_flatten, tree_unflatten

        from torchburn.partition import compile_graph

        name = op.name if not op.variant_test_name else f"{op.name}.{op.variant_test_name}"
        if op.name in NOT_COMPARABLE:
            return Verdict(name, EXCLUDED, "not comparable: random or uninitialised result")
        flat, spec = tree_flatten(((sample.input, *sample.args), dict(sample.kwargs)))
        where = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        tensors = [flat[i] for i in where]
        if not all(_is_dense(t) for t in tensors):
            return Verdict(name, EXCLUDED, "an input is not a dense strided tensor")

        def call(*ts: torch.Tensor) -> Any:
            leaves = list(flat)
            for i, t in zip(where, ts):
                leaves[i] = t
            args, kwargs = tree_unflatten(leaves, spec)
            return op.op(*args, **kwargs)

        try:
            with torch.no_grad():
                expected = call(*[t.clone() for t in tensors])
        except Exception as exc:
            return Verdict(name, EXCLUDED, f"eager raises {type(exc).__name__}")
        expected_leaves = tree_flatten(expected)[0]
        if not expected_leaves or not all(isinstance(x, torch.Tensor) for x in expected_leaves):
            return Verdict(name, EXCLUDED, "result holds a non-tensor")
        if not all(_is_dense(x) for x in expected_leaves):
            return Verdict(name, EXCLUDED, "result is not a dense strided tensor")

        def flat_call(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(tree_flatten(call(*ts))[0])

        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                gm = make_fx(
                    torch.func.functionalize(flat_call, remove="mutations"),
                    decomposition_table=self.decompositions,
                    tracing_mode="real",
                )(*[t.clone() for t in tensors])
            if _has_mutation(gm):
                # decompositions run below functionalization and may use in-place ops; AOTAutograd
                # functionalizes them away, so this harness does too
                gm = make_fx(torch.func.functionalize(gm, remove="mutations"), tracing_mode="real")(
                    *[t.clone() for t in tensors]
                )
        except Exception as exc:
            return Verdict(name, EXCLUDED, f"tracing raises {type(exc).__name__}")
        if _has_random_op(gm):
            return Verdict(name, EXCLUDED, "not comparable: the graph draws random numbers")
        data_dependent = _has_data_dependent_op(gm)
        if data_dependent:
            return Verdict(name, EXCLUDED, "data-dependent op (Dynamo breaks the graph there)")
        runnable, report = compile_graph(gm, self.engines, self.opts, "inference")
        failed = [p for p in report.partitions if p.status not in ("compiled", "cache hit")]
        if failed:
            return Verdict(name, FALLBACK, f"partition {failed[0].status}")
        if report.fallbacks:
            from torchburn import catalog

            op_, why = report.fallbacks[0]
            if not report.partitions and all(catalog.category(o) == "view" for o, _ in report.fallbacks):
                return Verdict(name, FALLBACK, f"{VIEWS_ONLY}: {op_}")
            return Verdict(name, FALLBACK, f"{op_}: {why}")
        inputs = [t.clone() for t in tensors]
        try:
            with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                warnings.simplefilter("always")
                actual = runnable(*inputs)
        except (Exception, BaseException) as exc:  # a Rust panic arrives as pyo3's PanicException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return Verdict(name, FALLBACK, f"native run raised {type(exc).__name__}: {exc}")
        if any("failed while running" in str(w.message) for w in caught):
            return Verdict(name, FALLBACK, "native run failed (eager took over)")
        try:
            torch.testing.assert_close(tuple(actual), tuple(expected_leaves), rtol=RTOL, atol=ATOL, equal_nan=True)
        except AssertionError as exc:
            detail = " ".join(str(exc).split())
            ops = sorted({o for p in report.partitions for o in p.ops if o != "getitem"})
            return Verdict(name, MISMATCH, f"{','.join(ops)}: {detail}")
        return Verdict(name, PASS)


def run_opinfo(samples_per_op: int = SAMPLES_PER_OP, only: set[str] | None = None) -> Results:
    """Judge the float32 OpInfo samples (a script can call this with other limits)."""
    started = time.perf_counter()
    harness = _Harness()
    results = Results()
    for op in _import_op_db():
        if only is not None and op.name not in only:
            continue
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        torch.manual_seed(0)
        name = op.name if not op.variant_test_name else f"{op.name}.{op.variant_test_name}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                samples = list(itertools.islice(op.sample_inputs("cpu", torch.float32), samples_per_op))
        except Exception as exc:
            results.verdicts.append(Verdict(name, EXCLUDED, f"sample_inputs raises {type(exc).__name__}"))
            continue
        for sample in samples:
            torch.manual_seed(0)
            results.verdicts.append(harness.judge(op, sample))
    results.seconds = time.perf_counter() - started
    return results


@pytest.fixture(scope="module")
def opinfo() -> Results:
    results = run_opinfo()
    table = results.table()
    print("\n" + table)
    path = os.environ.get("TORCHBURN_OPINFO_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(table + "\n")
    return results


def test_opinfo_float32_pass_rate_floor(opinfo: Results) -> None:
    c = opinfo.counts()
    assert c[PASS] + c[FALLBACK] + c[MISMATCH] > 1500, "too few judged samples: is op_db intact?"
    assert c[MISMATCH] == 0, opinfo.table()
    assert opinfo.rate() >= PASS_RATE_FLOOR, opinfo.table()


def test_opinfo_float32_pass_rate_target(opinfo: Results) -> None:
    assert opinfo.rate() >= PASS_RATE_TARGET


def test_model_set_ops_are_always_native(opinfo: Results) -> None:
    bad = [v for v in opinfo.verdicts if v.op in MUST_BE_NATIVE and v.bucket in (FALLBACK, MISMATCH)]
    seen = {v.op for v in opinfo.verdicts if v.bucket == PASS}
    missing = [op for op in MUST_BE_NATIVE if op not in seen]
    assert not missing, f"no passing OpInfo sample for {missing}"
    assert not bad, "\n".join(f"{v.op}: {v.bucket}: {v.reason[:200]}" for v in bad)


@pytest.mark.parametrize(
    "name",
    ["add", "nn.functional.gelu", "softmax", "mm", "cat", "sum", "where", "sort", "scatter_add", "lgamma", "repeat"],
)
def test_real_backend_agrees(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first sample through torch.compile (Dynamo + AOTAutograd) with TORCHBURN_ENGINE=native_cpu
    runs with no fallback node and matches eager, as the harness above says it does."""
    from torch.utils._pytree import tree_flatten

    import torchburn

    monkeypatch.setenv("TORCHBURN_ENGINE", "native_cpu")
    op = next(o for o in _import_op_db() if o.name == name and not o.variant_test_name)
    torch.manual_seed(0)
    sample = next(iter(op.sample_inputs("cpu", torch.float32)))

    def fn(*args: Any, **kwargs: Any) -> Any:
        return op.op(*args, **kwargs)

    torch._dynamo.reset()
    torchburn.reset_stats()
    compiled = torch.compile(fn, backend="torchburn", dynamic=False, options={"warn": False, "min_partition_size": 1})
    with torch.no_grad():
        actual = compiled(sample.input, *sample.args, **sample.kwargs)
        expected = fn(sample.input, *sample.args, **sample.kwargs)
    torch.testing.assert_close(tree_flatten(actual)[0], tree_flatten(expected)[0], rtol=RTOL, atol=ATOL)
    cov = torchburn.op_coverage()
    assert cov["native"], cov
    assert not cov["fallback"], cov["fallback"]
