"""turbo_torch's native Sequential path on the real native_cpu engine, through tb-core's interop.

tb-cython-dispatch's own tests run the same paths against a fake engine; here the prepared
program is native_cpu's (``NativeCpuEngine.prepare``), on both implementations of the dispatch
layer, against eager PyTorch.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

import turbo_torch
from tb_cython_dispatch import native

TOL: dict[str, Any] = {"rtol": 1e-5, "atol": 1e-5}  # float32 reassociation of the GEMM's dot products
CALLS = native.HOT_AFTER + 2 * (native.WARMUP + native.SAMPLES) + 2


def _mlp(bias: bool = True) -> Any:
    torch.manual_seed(0)
    nn = turbo_torch.nn
    return nn.Sequential(nn.Linear(20, 16, bias=bias), nn.ReLU(), nn.Linear(16, 4, bias=bias))


def _eager(m: Any, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.Sequential.forward(m, x)


def _slot(m: Any, x: torch.Tensor, cython_native: ModuleType) -> Any:
    attr = "_tb_site_compiled" if cython_native.IMPLEMENTATION == "compiled" else "_tb_site_python"
    with torch.no_grad():
        return m.__dict__[attr].lookup(m, cython_native.call_key(x))[3]


def test_the_program_is_native_cpus(cython_native: ModuleType) -> None:
    from tb_cpu_rust.program import PreparedNativeProgram

    assert native.native_available() == (True, "engine native_cpu")
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        outs = [m(x) for _ in range(CALLS)]
        want = _eager(m, x)
    slot = _slot(m, x, cython_native)
    assert slot.state == native.NATIVE and isinstance(slot.program, PreparedNativeProgram)
    assert turbo_torch.cache_info()["nn.Sequential"]["native"] == 1
    for out in outs:
        torch.testing.assert_close(out, want, **TOL)
    assert outs[-1].data_ptr() != outs[-2].data_ptr() and outs[-1].is_contiguous()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_shapes_and_biases_match_eager(cython_native: ModuleType, bias: bool, rows: int) -> None:
    m, x = _mlp(bias), torch.randn(rows, 20)
    with torch.no_grad():
        for _ in range(CALLS):
            m(x)
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
    assert _slot(m, x, cython_native).state == native.NATIVE


def test_parameter_changes_are_seen(cython_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        for _ in range(CALLS):
            m(x)
        slot = _slot(m, x, cython_native)
        m[0].weight.mul_(2.0)
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        m[0].weight.data = torch.randn(20, 16).t()  # another layout: the program refuses, the entry re-prepares
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        for _ in range(CALLS):
            m(x)
        assert slot.state == native.NATIVE and slot.prepares == 2
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        m[2].bias.data = torch.randn(3)  # eager raises, and so does this path
        with pytest.raises(RuntimeError):
            m(x)


def test_inference_mode_output(cython_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.inference_mode():
        outs = [m(x) for _ in range(CALLS)]
        want = _eager(m, x)
    assert outs[-1].is_inference()
    torch.testing.assert_close(outs[-1], want, **TOL)
