"""Out-of-range indices raise instead of reading a clamped element.

Each indexing kernel records a bad index in the partition's error words (read back with the
outputs, in the same single submission) and the call raises ``WgpuIndexError`` (an IndexError
and a RuntimeError, like torch's) naming the op, the index and the dimension's size. In-range
negative indices, where torch takes them, still work.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import tb_wgpu
import torchburn
from tb_wgpu.device import WgpuIndexError


def _compile(fn: Callable[..., torch.Tensor], **options: object) -> Callable[..., torch.Tensor]:
    torch._dynamo.reset()
    opts = {"engine": "wgpu", "warn": False, "fallback": "error", **options}
    return torch.compile(fn, backend="torchburn", dynamic=False, options=opts)  # type: ignore[no-any-return]


X = torch.arange(20, dtype=torch.float32).reshape(4, 5) * 0.5 - 3.0


def _index(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x[i] * 2.0


def _index_2d(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x[:, i] + 1.0


def _embedding(w: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return F.embedding(i, w) * 2.0


def _gather(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, 1, i) * 2.0


def _index_select(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.index_select(x, 0, i) * 2.0


def _nll(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(torch.log_softmax(x, dim=1), t)


# op, function, (good, too large, too negative) index tensors, whether torch wraps negatives
CASES = {
    "index": (_index, [1, -1, 3], [1, 4, 0], [0, -5, 2], True, "aten.index.Tensor"),
    "index_dim1": (_index_2d, [0, -5, 4], [5, 0], [-6, 0], True, "aten.index.Tensor"),
    "embedding": (_embedding, [[0, 3], [2, 1]], [[0, 4], [2, 1]], [[0, -1], [2, 1]], False, "aten.embedding"),
    "gather": (
        _gather,
        [[0, 4], [1, 1], [2, 3], [4, 0]],
        [[0, 5], [1, 1], [2, 3], [4, 0]],
        [[0, 1], [-1, 1], [2, 3], [4, 0]],
        False,
        "aten.gather",
    ),
    "index_select": (_index_select, [3, 0, 2], [3, 7, 2], [0, -1], False, "aten.index_select"),
    "nll_loss": (_nll, [0, 4, 2, 1], [0, 5, 2, 1], [0, -2, 2, 1], False, "aten.nll_loss_forward"),
}


# nll_loss takes int64 targets only
@pytest.mark.parametrize(
    ("name", "dtype"),
    [(n, d) for n in CASES for d in (torch.int64, torch.int32) if not (n == "nll_loss" and d == torch.int32)],
)
def test_bad_index_raises(name: str, dtype: torch.dtype) -> None:
    fn, good, big, negative, _, op = CASES[name]
    compiled = _compile(fn)
    i = torch.tensor(good, dtype=dtype)
    torch.testing.assert_close(compiled(X, i), fn(X, i))  # in range (negative ones included)
    for bad in (big, negative):
        b = torch.tensor(bad, dtype=dtype)
        with pytest.raises((IndexError, RuntimeError)):
            fn(X, b)  # torch refuses it too
        with pytest.raises(WgpuIndexError, match=op) as info:
            compiled(X, b)
        assert isinstance(info.value, IndexError) and isinstance(info.value, RuntimeError)
        wrong = [v for v in torch.tensor(bad).reshape(-1).tolist() if v not in torch.tensor(good).reshape(-1).tolist()]
        assert any(str(v) in str(info.value) for v in wrong), str(info.value)
    # the error words are cleared every call: a good input right after a bad one works
    torch.testing.assert_close(compiled(X, i), fn(X, i))


def test_bad_index_costs_no_extra_submission() -> None:
    compiled = _compile(_index)
    good = torch.tensor([1, -1, 3])
    compiled(X, good)
    tb_wgpu.reset_stats()
    compiled(X, good)
    with pytest.raises(WgpuIndexError):
        compiled(X, torch.tensor([9]))
    stats = tb_wgpu.stats()
    assert stats["submissions"] == 2 and stats["readbacks"] == 2, stats


def test_bad_index_falls_back_to_torchs_error_by_default() -> None:
    compiled = _compile(_index, fallback="eager")
    compiled(X, torch.tensor([0]))
    with pytest.warns(Warning), pytest.raises(IndexError):
        compiled(X, torch.tensor([7]))


def test_ignore_index_is_not_an_error() -> None:
    def fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(torch.log_softmax(x, dim=1), t, ignore_index=-100)

    t = torch.tensor([0, -100, 4, 1])
    torch.testing.assert_close(_compile(fn)(X, t), fn(X, t))


@pytest.mark.parametrize("emulated", [False, True])
@pytest.mark.parametrize("value", [2**32 + 1, -(2**32) + 1, 2**40])
def test_int64_index_beyond_int32_is_not_truncated(value: int, emulated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from tb_wgpu.device import context

    if emulated:
        monkeypatch.setattr(context(), "shader_int64", False)
    elif not context().shader_int64:
        pytest.skip("the adapter has no shader-int64")
    torchburn.clear_cache()  # a cached program would keep the other representation
    for fn, name in ((_index, "index"), (_index_select, "index_select"), (_nll, "nll_loss")):
        compiled = _compile(fn)
        bad = torch.tensor(CASES[name][1], dtype=torch.int64)
        bad[0] = value  # its low 32 bits are in range: truncating to i32 would read a wrong element
        with pytest.raises(WgpuIndexError, match="out of bounds"):
            compiled(X, bad)
    torchburn.clear_cache()


def test_error_words_share_no_buffer_with_earlier_temporaries() -> None:
    """Temporaries written and dead before the first indexing kernel must not reuse the error
    words' buffer (cleared once, before every dispatch): in-range calls never raise. (The case
    that caught it is test_int64's causal-LM mask; this one is a smaller partition of the shape.)"""

    def fn(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        a = torch.cumsum(torch.arange(20).reshape(4, 5) + 7, dim=1)  # int64 temporaries, dead below
        b = torch.softmax(x.sum(dim=1), dim=0)
        return x[i] * b[i].unsqueeze(1) + a.sum()

    compiled = _compile(fn)
    for idx in ([0, 3, -1], [2], [-4, 1, 1, 0]):
        i = torch.tensor(idx)
        torch.testing.assert_close(compiled(X, i), fn(X, i))
    with pytest.raises(WgpuIndexError):
        compiled(X, torch.tensor([4]))
