"""``_native.fma_peak_gflops``: the float32 FMA peak the benchmarks' GEMM rows give their fraction
of peak against (measured, ``core::fma_peak``). Only its contract is tested here, never a speed."""

from __future__ import annotations

import math

import pytest

from tb_cpu_rust import _native


@pytest.mark.parametrize("threads", [1, 2])
def test_reports_a_finite_positive_rate(threads: int) -> None:
    gflops = _native.fma_peak_gflops(threads, 0.01)
    assert math.isfinite(gflops) and gflops > 0


@pytest.mark.parametrize(("threads", "seconds"), [(0, 0.01), (1, 0.0), (1, -1.0), (1, float("nan")), (1, 11.0)])
def test_bad_arguments_are_named(threads: int, seconds: float) -> None:
    with pytest.raises(ValueError, match=r"threads|seconds"):
        _native.fma_peak_gflops(threads, seconds)


def test_negative_thread_count_is_refused() -> None:
    with pytest.raises(OverflowError):
        _native.fma_peak_gflops(-1)
