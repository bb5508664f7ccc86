"""The partition IR engines compile: a flat, serializable list of ATen calls.

A ``Plan`` names its values by slot: slots ``0..len(inputs)-1`` are the partition's inputs,
then one slot per node in order. Arguments are literals or ``Ref(slot)``. Because a plan refers
to nothing but slots, two structurally identical partitions (say, two transformer layers)
produce byte-identical canonical forms, and so the same BLAKE3 key.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import blake3
import torch
import torch.fx

GETITEM = "getitem"


class PlanError(ValueError):
    """A plan could not be built or read back (unknown op, literal of an unsupported type)."""


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str
    symbolic: bool = False

    @staticmethod
    def of(value: Any) -> TensorMeta:
        shape = tuple(value.shape)
        stride = tuple(value.stride()) if value.layout == torch.strided else ()
        symbolic = any(not isinstance(s, int) for s in (*shape, *stride))
        if symbolic:
            shape = tuple(s if isinstance(s, int) else -1 for s in shape)
            stride = tuple(s if isinstance(s, int) else -1 for s in stride)
        return TensorMeta(shape, stride, value.dtype, value.device.type, symbolic)

    @staticmethod
    def hint_of(value: Any) -> TensorMeta | None:
        """The static meta of a tensor whose sizes may be symbolic, from its sizes' hints (the
        concrete values of the example the graph was traced with); None if a size has no hint
        (a data-dependent size)."""
        shape = tuple(size_hint(s) for s in value.shape)
        stride = tuple(size_hint(s) for s in value.stride()) if value.layout == torch.strided else ()
        if any(not isinstance(s, int) for s in (*shape, *stride)):
            return None
        return TensorMeta(shape, stride, value.dtype, value.device.type)  # type: ignore[arg-type]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def to_json(self) -> list[Any]:
        return [list(self.shape), list(self.stride), str(self.dtype), self.device, self.symbolic]

    @staticmethod
    def from_json(data: list[Any]) -> TensorMeta:
        shape, stride, dtype, device, symbolic = data
        return TensorMeta(tuple(shape), tuple(stride), _dtype(dtype), device, bool(symbolic))


@dataclass(frozen=True)
class Ref:
    """A reference to a value slot of the plan."""

    slot: int


@dataclass
class PlanNode:
    op: str  # "aten.add.Tensor", or "getitem"
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    # One TensorMeta, a tuple of them (multi-output ops), or None for non-tensor results.
    out: Any
    target: Callable[..., Any] = field(repr=False, compare=False, default=None)  # type: ignore[assignment]


@dataclass
class Plan:
    inputs: list[TensorMeta | None]  # None: a non-tensor input (a SymInt, say)
    nodes: list[PlanNode]
    outputs: list[Any]  # Refs (or literals)
    constants: dict[int, torch.Tensor] = field(default_factory=dict)  # input slot -> tensor
    single_output: bool = False

    def slot_meta(self, slot: int) -> Any:
        if slot < len(self.inputs):
            return self.inputs[slot]
        return self.nodes[slot - len(self.inputs)].out

    def ops(self) -> Iterator[str]:
        return (n.op for n in self.nodes)

    # -- canonical form -------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": [m.to_json() if m is not None else None for m in self.inputs],
            "nodes": [[n.op, _encode(n.args), _encode(n.kwargs), _encode_out(n.out)] for n in self.nodes],
            "outputs": _encode(self.outputs),
            "single_output": self.single_output,
            "constants": {str(k): _tensor_digest(v) for k, v in sorted(self.constants.items())},
        }

    def canonical(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    def key(self, *salt: str) -> str:
        """BLAKE3 over the canonical form plus ``salt`` (engine name, versions)."""
        hasher = blake3.blake3(self.canonical())
        for s in salt:
            hasher.update(b"\0" + s.encode())
        return hasher.hexdigest()

    @staticmethod
    def from_json(data: dict[str, Any], constants: dict[int, torch.Tensor] | None = None) -> Plan:
        nodes = []
        for op, args, kwargs, out in data["nodes"]:
            nodes.append(PlanNode(op, tuple(_decode(args)), _decode(kwargs), _decode_out(out), resolve_op(op)))
        return Plan(
            inputs=[TensorMeta.from_json(m) if m is not None else None for m in data["inputs"]],
            nodes=nodes,
            outputs=_decode(data["outputs"]),
            constants=dict(constants or {}),
            single_output=bool(data["single_output"]),
        )


def resolve_op(name: str) -> Callable[..., Any]:
    """``"aten.add.Tensor"`` -> ``torch.ops.aten.add.Tensor``; ``"getitem"`` -> operator.getitem."""
    if name == GETITEM:
        return operator.getitem
    try:
        namespace, packet, overload = name.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)  # type: ignore[no-any-return]
    except (ValueError, AttributeError, RuntimeError) as exc:
        raise PlanError(f"unknown op {name!r} in plan") from exc


def op_name(target: Any) -> str:
    if target is operator.getitem:
        return GETITEM
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__qualname__", repr(target))


# -- encoding of literals -------------------------------------------------------------------
def _encode(value: Any) -> Any:
    if isinstance(value, Ref):
        return {"$ref": value.slot}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"$float": repr(value)}
    if isinstance(value, (list, tuple)):
        return {"$list" if isinstance(value, list) else "$tuple": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"$dict": {k: _encode(v) for k, v in sorted(value.items())}}
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value)}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"$memory_format": str(value)}
    if isinstance(value, torch.layout):
        return {"$layout": str(value)}
    raise PlanError(f"cannot put a literal of type {type(value).__name__} into a plan")


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    ((tag, payload),) = value.items()
    if tag == "$ref":
        return Ref(payload)
    if tag == "$float":
        return float(payload)
    if tag == "$list":
        return [_decode(v) for v in payload]
    if tag == "$tuple":
        return tuple(_decode(v) for v in payload)
    if tag == "$dict":
        return {k: _decode(v) for k, v in payload.items()}
    if tag == "$dtype":
        return _dtype(payload)
    if tag == "$device":
        return torch.device(payload)
    if tag == "$memory_format":
        return getattr(torch, payload.removeprefix("torch."))
    if tag == "$layout":
        return getattr(torch, payload.removeprefix("torch."))
    raise PlanError(f"unknown literal tag {tag!r} in plan")


def _encode_out(out: Any) -> Any:
    if isinstance(out, TensorMeta):
        return {"$meta": out.to_json()}
    if isinstance(out, tuple):
        return [_encode_out(o) for o in out]
    return None


def _decode_out(out: Any) -> Any:
    if isinstance(out, dict):
        return TensorMeta.from_json(out["$meta"])
    if isinstance(out, list):
        return tuple(_decode_out(o) for o in out)
    return None


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise PlanError(f"unknown dtype {name!r} in plan")
    return dtype


def _tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    header = f"{t.dtype}:{tuple(t.shape)}:".encode()
    return blake3.blake3(header + t.view(torch.uint8).numpy().tobytes()).hexdigest()


def size_hint(value: Any) -> Any:
    """The concrete value behind a symbolic int/float/bool (its hint), the value itself if it is
    not symbolic, or None for a symbol without a hint (an unbacked, data-dependent size)."""
    if not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value
    node = value.node
    try:
        if not node.has_hint():
            return None
        hint: Any = node.hint
    except Exception:  # a shape environment that cannot evaluate the expression
        return None
    if hint is None:
        return None
    if isinstance(value, torch.SymBool):
        return bool(hint)
    return int(hint) if isinstance(value, torch.SymInt) else float(hint)


def meta_of_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorMeta.of(value)
    if isinstance(value, (tuple, list)):
        return tuple(meta_of_value(v) for v in value)
    return None


# -- from an FX sub-graph ---------------------------------------------------------------------
def plan_from_graph_module(gm: torch.fx.GraphModule) -> Plan:
    """Build the plan of a fused partition sub-module (placeholders, calls, one output)."""
    slots: dict[torch.fx.Node, int] = {}
    inputs: list[TensorMeta | None] = []
    constants: dict[int, torch.Tensor] = {}
    nodes: list[PlanNode] = []
    outputs: list[Any] = []
    single = False

    def ref(arg: Any) -> Any:
        return torch.fx.node.map_arg(arg, lambda n: Ref(slots[n]))  # type: ignore[arg-type, return-value]

    body = [n for n in gm.graph.nodes if n.op in ("call_function", "get_attr", "output")]
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            slots[node] = len(inputs)
            inputs.append(meta_of_value(node.meta.get("val")))
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise PlanError(f"get_attr {node.target} is not a tensor")
            slots[node] = len(inputs)
            constants[len(inputs)] = value
            inputs.append(TensorMeta.of(value))
    offset = len(inputs)
    for node in body:
        if node.op == "call_function":
            slots[node] = offset + len(nodes)
            nodes.append(
                PlanNode(
                    op_name(node.target),
                    tuple(ref(node.args)),
                    dict(ref(node.kwargs)),
                    meta_of_value(node.meta.get("val")),
                    node.target,
                )
            )
        elif node.op == "output":
            result = node.args[0]
            if isinstance(result, (tuple, list)):
                outputs = list(ref(tuple(result)))
            else:
                outputs = [ref(result)]
                single = True
    return Plan(inputs, nodes, outputs, constants, single)
