"""Run bfloat16 / float16 compute in float32, rounding where eager rounds.

Engines compute in float32 and carry bfloat16 and float16 as storage only (copies and casts).
Eager PyTorch on the CPU computes a bfloat16 op the same way: it reads bfloat16, computes and
accumulates in float32 (the op's "opmath" type) and rounds the op's result to bfloat16. This
pass rewrites an ATen graph to say so explicitly, in ops every engine takes:

    y = addmm(b, x, w)                    b32 = _to_copy(b, dtype=float32)   (once per value)
        (bfloat16)              ->        y32 = addmm(b32, x32, w32)         (float32)
                                          y   = _to_copy(y32, dtype=bfloat16)  (eager's rounding)

A later widened op that reads ``y`` reads ``_to_copy(y, dtype=float32)``: the round trip is the
rounding and stays. Ops whose float32 result is exactly representable in the low-precision dtype
(relu, max, pooling by max, concatenation, ...) skip it: their float32 result feeds the next op
directly. Views are not rewritten in place (an output may alias an input): a widened op that reads
a view of a low-precision value reads the same view of that value's float32 twin, so a weight is
cast once, before its transpose. Casts the graph already holds (autocast's, AOTAutograd's) are
reused as twins. Nodes nothing reads any more are removed.

Every new node carries ``meta["val"]`` (computed with the graph's fake tensor mode), which is what
engines decide support from. A graph with no low-precision floating compute is returned untouched;
running the pass twice changes nothing the second time. ``TORCHBURN_LOW_PRECISION=0`` or
``options={"low_precision": False}`` turns it off.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx

from torchburn import catalog
from torchburn.engine import Engine
from torchburn.nodeinfo import NodeInfo
from torchburn.plan import TensorMeta

log = logging.getLogger("torchburn")

aten = torch.ops.aten
F32 = torch.float32
#: Bumped when the rewrite changes what a widened graph computes or how (a stored widened-or-as-
#: traced decision, ``low_precision_route.decision_key``, was measured on the old rewrite).
#: 2: a convolution's epilogue chain rounded once; relu / hardtanh through a view commute.
REWRITE_VERSION = 2
LOW = frozenset({torch.bfloat16, torch.float16})
TO_COPY = aten._to_copy.default

#: Families computed in float32 (their kernels' opmath); a category of the op catalog.
_CATEGORIES = frozenset(
    {
        "gemm",
        "conv_pool",
        "attention",
        "normalization",
        "elementwise_unary",
        "elementwise_binary",
        "elementwise_ternary",
        "reduction",
        "backward",
    }
)
#: Copy-family ops computed as they are in float32 (exact).
_COPIES = frozenset({"aten.cat.default", "aten.constant_pad_nd.default", "aten.clone.default", "aten.flip.default"})
#: Ops whose float32 result, from float32 twins of low-precision inputs, is exactly representable
#: in the low-precision dtype: no rounding cast between them and the next widened op.
EXACT = frozenset(
    {
        "aten.relu.default",
        "aten.neg.default",
        "aten.abs.default",
        "aten.maximum.default",
        "aten.minimum.default",
        "aten.amax.default",
        "aten.amin.default",
        "aten.max.dim",
        "aten.min.dim",
        "aten.max_pool2d_with_indices.default",
        "aten.max_pool3d_with_indices.default",
        "aten.adaptive_max_pool2d.default",
        "aten.adaptive_max_pool3d.default",
        "aten.where.self",
        "aten.ceil.default",
        "aten.floor.default",
        "aten.round.default",
        "aten.trunc.default",
        "aten.sign.default",
        "aten.threshold_backward.default",
        *_COPIES,
    }
)
#: Exact ops that also commute with rounding to a low-precision dtype (monotone, zero kept):
#: ``relu(round(y)) == round(relu(y))``. One that reads only the rounded result of another
#: widened op is computed on that op's float32 result and rounded after it, so the two stay
#: adjacent in float32 (an engine fuses them: a GEMM's activation epilogue) and the rounding
#: happens once, after both.
COMMUTES = frozenset({"aten.relu.default", "aten.hardtanh.default"})
#: Producers whose epilogue (``CONV_EPILOGUE``) the engines run on the producer's float32 result.
CONV_PRODUCERS = frozenset({"aten.convolution.default"})
#: The per-element ops that follow a convolution in convolutional nets (inference batch norm,
#: a residual add, activations). One that reads the single-use rounded result of a convolution,
#: or of such an op that read one, reads the float32 result instead, so the chain stays adjacent
#: in float32 and is rounded once, at its end: an engine runs it as the convolution's epilogue
#: (batch norm folded into the weights, the add and the activation on the accumulators), as
#: inductor and oneDNN's post-ops do. Unlike ``COMMUTES`` this is not exact: it drops eager's
#: rounding of each intermediate result (half a unit in the last place of the low dtype each,
#: then carried through the chain), so the result is at least as close to the float32 value as
#: eager's, and within the low dtype's tolerance of eager's own.
CONV_EPILOGUE = frozenset(
    {
        "aten._native_batch_norm_legit_no_training.default",
        "aten.add.Tensor",
        "aten.relu.default",
        "aten.hardtanh.default",
        "aten.clamp.default",
        "aten.silu.default",
    }
)
#: Views a widened op may read through: the same view of the float32 twin.
VIEWS = frozenset(
    {
        "aten.view.default",
        "aten._unsafe_view.default",
        "aten.reshape.default",
        "aten.permute.default",
        "aten.t.default",
        "aten.transpose.int",
        "aten.expand.default",
        "aten.select.int",
        "aten.slice.Tensor",
        "aten.squeeze.dim",
        "aten.squeeze.dims",
        "aten.squeeze.default",
        "aten.unsqueeze.default",
        "aten.alias.default",
        "aten.diagonal.default",
        "aten.as_strided.default",
    }
)
#: Backward ops whose fourth argument names the forward input's dtype (their result's dtype).
_BACKWARD_INPUT_DTYPE = frozenset({"aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default"})
#: Ops the catalog files under a widened family that must keep their own dtype rules.
_NOT_WIDENED = frozenset({"aten.cumsum.default", "aten.prod.default", "aten.prod.dim_int"})


def widened_op(op: str) -> bool:
    """Whether the pass computes ``op`` in float32 when it reads or writes bfloat16 / float16."""
    if op in _NOT_WIDENED:
        return False
    return op in _COPIES or catalog.category(op) in _CATEGORIES


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def _is_low(x: Any) -> bool:
    v = _val(x)
    return isinstance(v, torch.Tensor) and v.dtype in LOW


def _wants_widening(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if not widened_op(str(node.target)):
        return False
    if node.kwargs.get("dtype") is not None:
        return False  # an explicit compute dtype is the op's own rule
    out: Any = node.meta.get("val")
    outs = _tensors(out)
    if not outs or (not isinstance(out, torch.Tensor) and len(outs) != len(out)):
        return False  # no tensor result, or a result that is not a tensor (None, a size)
    ins = [_val(a) for a in node.all_input_nodes]
    if any(not isinstance(v, torch.Tensor) for v in ins):
        return False  # a symbolic scalar or an untyped input: leave the node as it is
    floats = [t.dtype for t in [*ins, *outs] if t.dtype.is_floating_point]
    if not any(d in LOW for d in floats):
        return False
    # float64 beside a low-precision dtype, or complex values: not this pass's business
    return all(d in LOW or d == F32 for d in floats) and not any(t.dtype.is_complex for t in [*ins, *outs])


def _is_cast_to_f32(node: torch.fx.Node) -> bool:
    return bool(
        node.op == "call_function"
        and node.target is TO_COPY
        and len(node.args) == 1
        and set(node.kwargs) <= {"dtype", "layout", "device"}
        and node.kwargs.get("dtype") == F32
        and node.kwargs.get("layout") in (None, torch.strided)
        and _is_low(node.args[0])
    )


class _Widener:
    def __init__(self, gm: torch.fx.GraphModule, keep: Callable[[torch.fx.Node], bool]) -> None:
        self.keep = keep
        self.gm = gm
        self.graph = gm.graph

        # the mode of the graph's own values (not the tracing context's: Dynamo hands backends a
        # fresh mode, and fake tensors of two modes do not mix): its inputs' mode. Constants
        # (get_attr: a rotary table) may carry another; `fake` re-makes those in this one.
        def modes_of(nodes: Iterable[torch.fx.Node]) -> set[Any]:
            return {getattr(t, "fake_mode", None) for n in nodes for t in _tensors(n.meta.get("val"))}

        modes = modes_of(n for n in self.graph.nodes if n.op == "placeholder")
        if len(modes) != 1 or None in modes:
            modes = modes_of(self.graph.nodes)
        self.fake_mode = modes.pop() if len(modes) == 1 else None
        self.twin: dict[torch.fx.Node, torch.fx.Node] = {}
        # a rounding cast this pass made -> the float32 result it rounds
        self.rounded: dict[torch.fx.Node, torch.fx.Node] = {}
        # rounding casts of a convolution or of its epilogue chain (``CONV_EPILOGUE``)
        self.conv_chain: set[torch.fx.Node] = set()
        self.widened: Counter[str] = Counter()

    def own(self, val: Any) -> Any:
        """``val`` as a fake tensor of the graph's mode (a constant's may be of another mode)."""
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        if not isinstance(val, FakeTensor) or val.fake_mode is self.fake_mode or self.fake_mode is None:
            return val
        with unset_fake_temporarily():
            real = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device=val.device)
        return self.fake_mode.from_tensor(real)

    def fake(self, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        fa, fk = torch.fx.node.map_arg((args, kwargs), lambda n: self.own(n.meta["val"]))
        assert self.fake_mode is not None
        # compiled under torch.autocast, the graph's ops are already cast: autocast must not
        # change the dtype of the float32 op typed here
        with self.fake_mode, torch._C._DisableAutocast():
            return target(*fa, **fk)

    def make(
        self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], like: torch.fx.Node, val: Any = None
    ) -> torch.fx.Node:
        if val is None:
            val = self.fake(target, args, kwargs)
        node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = val
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in like.meta:
                node.meta[key] = like.meta[key]
        return node

    def cast(self, src: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
        return self.make(TO_COPY, (src,), {"dtype": dtype}, src)

    def f32_of(self, node: torch.fx.Node) -> torch.fx.Node:
        """The float32 twin of a low-precision value (same values), made once."""
        if node in self.twin:
            return self.twin[node]
        if (
            node.op == "call_function"
            and str(node.target) in VIEWS
            and node.args
            and isinstance(node.args[0], torch.fx.Node)
            and _is_low(node.args[0])
            and all(a is node.args[0] for a in node.all_input_nodes)
        ):
            base = self.f32_of(node.args[0])
            with self.graph.inserting_after(node):
                twin = self.make(node.target, (base, *node.args[1:]), dict(node.kwargs), node)
        elif node.op == "placeholder":
            with self.graph.inserting_before(next(n for n in self.graph.nodes if n.op != "placeholder")):
                twin = self.cast(node, F32)
        else:
            with self.graph.inserting_after(node):
                twin = self.cast(node, F32)
        self.twin[node] = twin
        return twin

    def widen(self, node: torch.fx.Node) -> None:
        op = str(node.target)

        def arg(a: Any) -> Any:
            return self.f32_of(a) if _is_low(a) else a

        exact = op in EXACT
        src = node.args[0] if node.args else None
        # rounded results this op reads before their rounding (see COMMUTES, CONV_EPILOGUE):
        # each such argument -> the float32 value it reads instead
        unrounded: dict[torch.fx.Node, torch.fx.Node] = {}
        if op in COMMUTES and isinstance(src, torch.fx.Node) and self._commutes(node):
            wide_src = self._unrounded(src, node)
            if wide_src is not None:
                unrounded[src] = wide_src
        if op in CONV_EPILOGUE:
            for a in node.args:
                if isinstance(a, torch.fx.Node) and self._single_rounded(a) and a in self.conv_chain:
                    unrounded[a] = self.rounded[a]

        def arg_of(a: Any) -> Any:
            return unrounded[a] if a in unrounded else arg(a)

        args, kwargs = torch.fx.node.map_arg((node.args, dict(node.kwargs)), arg_of)
        # an op reading an unrounded value is not exact any more (its input is not a low value)
        exact = exact and not unrounded
        chained = op in CONV_PRODUCERS or any(a in self.conv_chain for a in unrounded)
        if op in ("aten._softmax.default", "aten._log_softmax.default") and len(args) > 2:
            args = (*args[:2], False)  # float32 in, float32 out: half_to_float has nothing left to do
        if op in _BACKWARD_INPUT_DTYPE and len(args) > 3 and args[3] in LOW:
            args = (*args[:3], F32)  # the forward's input dtype: its twin's, float32
        try:
            val = self.fake(node.target, tuple(args), kwargs)
        except Exception as exc:  # the op has no float32 form here: it stays as traced
            log.debug("torchburn: %s stays in its own dtype (%s: %s)", node.name, type(exc).__name__, exc)
            return
        with self.graph.inserting_before(node):
            wide = self.make(node.target, tuple(args), kwargs, node, val)
        self.widened[op] = self.widened[op] + 1
        out = node.meta["val"]
        if isinstance(out, torch.Tensor):
            with self.graph.inserting_after(wide):
                back = self.cast(wide, out.dtype) if out.dtype in LOW else wide
            node.replace_all_uses_with(back)
            if back is not wide and exact:
                self.twin[back] = wide
            elif back is not wide:
                self.rounded[back] = wide
                if chained:
                    self.conv_chain.add(back)
            self.graph.erase_node(node)
            return
        # several results: each getitem of the old node reads the new one, rounded where it was low
        for user in list(node.users):
            index = user.args[1]
            with self.graph.inserting_before(user):
                item = self.graph.call_function(operator.getitem, (wide, index))
                item.meta = dict(user.meta)
                item.meta["val"] = wide.meta["val"][index]
                dtype = out[index].dtype if isinstance(out[index], torch.Tensor) else None
                back = self.cast(item, dtype) if dtype in LOW and item.meta["val"].dtype != dtype else item
            user.replace_all_uses_with(back)
            if back is not item and exact:
                self.twin[back] = item
            elif back is not item and index == 0:
                self.rounded[back] = item  # the op's result (a norm's; not its statistics)
                if chained:
                    self.conv_chain.add(back)
            self.graph.erase_node(user)
        self.graph.erase_node(node)

    def _single_rounded(self, a: Any) -> bool:
        """A rounding cast this pass made that nothing else reads."""
        return isinstance(a, torch.fx.Node) and a in self.rounded and len(a.users) == 1

    def _unrounded(self, a: torch.fx.Node, consumer: torch.fx.Node) -> torch.fx.Node | None:
        """The float32 value of ``a`` before its rounding, if only ``consumer`` reads ``a``: ``a``
        a rounding this pass made, or a view of one that nothing else reads (a Linear's 3-d
        result: addmm, rounding, view, relu), whose same view of the float32 result is made here."""
        if len(a.users) != 1:
            return None
        if a in self.rounded:
            return self.rounded[a]
        base = a.args[0] if a.op == "call_function" and a.args else None
        if (
            str(a.target) not in VIEWS
            or not isinstance(base, torch.fx.Node)
            or not self._single_rounded(base)
            or any(x is not base for x in a.all_input_nodes)
        ):
            return None
        with self.graph.inserting_before(consumer):
            return self.make(a.target, (self.rounded[base], *a.args[1:]), dict(a.kwargs), a)

    def _commutes(self, node: torch.fx.Node) -> bool:
        """relu always; hardtanh when its bounds are values of the low dtype (ReLU6's 0 and 6):
        clamping to representable bounds and rounding then commute."""
        if node.target is not aten.hardtanh.default:
            return True
        low = _val(node.args[0]).dtype
        bounds = [*node.args[1:3], *[-1.0, 1.0][len(node.args) - 1 :]]
        return all(isinstance(b, (int, float)) and float(torch.tensor(b, dtype=low)) == b for b in bounds)

    def run(self) -> bool:
        if self.fake_mode is None:
            return False
        wanted = {n for n in self.graph.nodes if _wants_widening(n) and not self.keep(n)}
        candidates = [n for n in self.graph.nodes if n in wanted or _is_cast_to_f32(n)]
        if not wanted:
            return False
        for node in candidates:
            if _is_cast_to_f32(node):
                self.twin.setdefault(node.args[0], node)  # type: ignore[arg-type]
                continue
            multi = not isinstance(node.meta["val"], torch.Tensor)
            if multi and any(u.target is not operator.getitem or not isinstance(u.args[1], int) for u in node.users):
                continue
            self.widen(node)
        self.graph.eliminate_dead_code()
        self.graph.lint()
        self.gm.recompile()
        return True


def widen_low_precision(
    gm: torch.fx.GraphModule, keep: Callable[[torch.fx.Node], bool] | None = None
) -> torch.fx.GraphModule:
    """Rewrite ``gm`` in place (and return it) so its bfloat16 / float16 compute runs in float32
    between casts at eager's rounding points. A graph the pass cannot type (no fake tensors) or
    with nothing to widen is returned unchanged; a node whose float32 form cannot be typed stays
    as traced, and so does a node ``keep`` says to keep (``taken_as_is``: an engine in force
    computes it in its own dtype, as wgpu does float16)."""
    widener = _Widener(gm, keep or (lambda node: False))
    if widener.run():
        log.debug("torchburn: computed in float32: %s", dict(widener.widened))
    return gm


def low_precision_ops(nodes: Iterable[torch.fx.Node]) -> Counter[str]:
    """Ops of ``nodes`` that read or write bfloat16 / float16 and the pass would widen."""
    return Counter(str(n.target) for n in nodes if _wants_widening(n))


def _as_float32(info: NodeInfo) -> NodeInfo:
    """What the engine would be asked about the node's float32 form (its low metas widened)."""

    def widen(meta: Any) -> Any:
        if isinstance(meta, TensorMeta) and meta.dtype in LOW:
            return dataclasses.replace(meta, dtype=F32)
        if isinstance(meta, tuple):
            return tuple(widen(m) for m in meta)
        return meta

    return dataclasses.replace(info, inputs=[widen(m) for m in info.inputs], out=widen(info.out))


def taken_as_is(engines: Sequence[Engine]) -> Callable[[torch.fx.Node], bool]:
    """``keep`` for ``widen_low_precision``: in the engines' priority order, the first engine that
    takes the node either in its own low-precision dtype or in float32 decides; a node it takes as
    it is (wgpu's float16 kernels) is left to that engine. Asked as the partitioner asks: as it is,
    or as its hint when its sizes are symbolic."""

    def takes(engine: Engine, info: NodeInfo) -> bool:
        try:
            return engine.check(info) is None
        except Exception:  # a buggy checker means "no", as in the partitioner
            return False

    def keep(node: torch.fx.Node) -> bool:
        info: NodeInfo | str = NodeInfo.of(node)
        if isinstance(info, NodeInfo) and info.symbolic:
            info = NodeInfo.hinted(node)
        if not isinstance(info, NodeInfo):
            return False
        wide = _as_float32(info)
        for engine in engines:
            if takes(engine, info):
                return True
            if takes(engine, wide):
                return False
        return False

    return keep
