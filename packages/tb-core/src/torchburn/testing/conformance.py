"""The engine conformance suite. An engine package runs it by subclassing once:

    from torchburn.testing import EngineConformance

    class TestMyEngine(EngineConformance):
        engine = "my_engine"
        xfail = {"gelu-special": "reason the case cannot pass yet"}

Every case compiles a small function with ``options={"engine": engine, "fallback": "error"}``
and compares with eager PyTorch. Cases whose dtype is in ``native_dtypes`` and whose ops are all
in ``native_ops`` (None: every op) must also run with no eager fallback for those ops: the
engine must take them (with its own kernel, or delegated to PyTorch's as it declares in
``Engine.delegated_ops``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from torchburn.testing.cases import CASES, OpCase
from torchburn.testing.models import MODELS


def compile_with(engine: str, fn: Any, **options: Any) -> tuple[Any, list[Any]]:
    from torchburn.backend import torchburn_backend

    sink: list[Any] = []
    opts = {
        "engine": engine,
        "fallback": "error",
        "min_partition_size": 1,
        "routing": "off",  # the engine's kernels must run, whatever eager measures
        "warn": False,
        "report_sink": sink,
        **options,
    }

    def backend(gm: Any, inputs: Any) -> Any:
        return torchburn_backend(gm, inputs, options=opts)

    # A fresh Dynamo state per case: the wrapper's code object is shared between cases, and
    # guard failures on it would otherwise hit the recompile limit and silently run eager.
    torch._dynamo.reset()

    def call(*args: Any) -> Any:  # builtins such as torch.tanh have no frame to compile
        return fn(*args)

    return torch.compile(call, backend=backend, dynamic=False), sink


def native_and_fallback(reports: list[Any]) -> tuple[set[str], set[str]]:
    native: set[str] = set()
    fallback: set[str] = set()
    for r in reports:
        native.update(r.engine_ops())
        fallback.update(op for op, _ in r.fallbacks)
    return native, fallback


def _exact_where_eager_is_nan(case: OpCase, inputs: Any, expected: Any, actual: Any) -> Any:
    """Eager's answer, except where eager's float32 kernel says NaN and the exact value is not NaN.

    PyTorch's vectorised float32 kernels of some ops return NaN at infinite inputs where the exact
    value, and PyTorch's own scalar and float64 kernels, are not NaN (``F.gelu`` at +inf: inf from
    ``gelu(torch.tensor([inf]))``, NaN from the vectorised loop over a longer tensor, depending on
    where the element falls and the CPU). There an engine may give either answer: the value it is
    held to is PyTorch's float64 result, rounded to the output dtype.
    """
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        return expected
    if not expected.dtype.is_floating_point or not bool(torch.isnan(expected).any()):
        return expected
    if not bool((torch.isnan(expected) & ~torch.isnan(actual)).any()):
        return expected
    wide = [t.double() if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t for t in inputs]
    exact = case.fn(*wide)
    if not isinstance(exact, torch.Tensor) or exact.shape != expected.shape:
        return expected
    return torch.where(torch.isnan(expected), exact.to(expected.dtype), expected)


class EngineConformance:
    engine: ClassVar[str] = ""
    xfail: ClassVar[dict[str, str]] = {}
    native_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset({torch.float32})
    native_ops: ClassVar[frozenset[str] | None] = None
    #: Models of torchburn.testing.models that must run with no eager fallback at all.
    native_models: ClassVar[frozenset[str]] = frozenset()
    rtol: ClassVar[float] = 1.3e-6
    atol: ClassVar[float] = 1e-5

    def _maybe_xfail(self, case_id: str) -> None:
        if case_id in self.xfail:
            pytest.xfail(self.xfail[case_id])

    @pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
    def test_op(self, case: OpCase) -> None:
        self._maybe_xfail(case.id)
        gen = torch.Generator().manual_seed(0)
        inputs = case.inputs(gen)
        expected = case.fn(*inputs)
        compiled, reports = compile_with(self.engine, case.fn)
        actual = compiled(*inputs)
        torch.testing.assert_close(
            actual,
            _exact_where_eager_is_nan(case, inputs, expected, actual),
            rtol=case.rtol or self.rtol,
            atol=case.atol or self.atol,
            equal_nan=True,
        )
        must_be_native = case.dtype in self.native_dtypes and (
            self.native_ops is None or all(op in self.native_ops for op in case.ops)
        )
        if must_be_native:
            native, fallback = native_and_fallback(reports)
            missing = [op for op in case.ops if op in fallback or op not in native]
            assert not missing, f"{self.engine} did not run {missing} natively; reports: {reports}"

    @pytest.mark.parametrize("model_name", sorted(MODELS))
    def test_model(self, model_name: str) -> None:
        self._maybe_xfail(f"model-{model_name}")
        if model_name == "tiny_causal_lm":
            pytest.importorskip("transformers", reason="the tiny causal LM is built with transformers")
        model, args = MODELS[model_name]()
        with torch.no_grad():
            expected = model(*args)
            compiled, reports = compile_with(self.engine, model)
            actual = compiled(*args)
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
        if model_name in self.native_models:
            _, fallback = native_and_fallback(reports)
            assert not fallback, f"{model_name} fell back for {sorted(fallback)}"
