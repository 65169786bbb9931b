"""From onnx-ir nodes and values to the SDK's NodeInfo and ValueInfo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxep.providers.node import NodeInfo, ValueInfo


def _dim(d: Any) -> int | str | None:
    if isinstance(d, int):
        return d
    value = getattr(d, "value", None)
    return value if isinstance(value, (int, str)) else None


def value_kind(t: Any) -> str:
    if t is None:
        return "unknown"
    if isinstance(t, ir.TensorType):
        return "tensor"
    if isinstance(t, ir.SequenceType):
        return "sequence"
    if isinstance(t, ir.OptionalType):
        return "optional"
    if isinstance(t, ir.SparseTensorType):
        return "sparse"
    return "map" if "Map" in type(t).__name__ else "unknown"


def _elem_dtype(t: Any) -> np.dtype | None:
    while t is not None and not isinstance(t, ir.TensorType):
        t = getattr(t, "elem_type", None)
    if t is None:
        return None
    try:
        return np.dtype(t.dtype.numpy())
    except Exception:
        return None


def const_of(value: ir.Value) -> Any:
    tensor = value.const_value
    if tensor is None:
        return None
    try:
        return _native(tensor.numpy())
    except Exception:
        return None


def _native(arr: Any) -> Any:
    """``arr`` viewed with NumPy's own descriptor of its type where it carries another one
    of the same type (``<f4`` with an explicit byte order, as arrays read from a model's
    bytes do): a ufunc with such an operand costs about 18 ns more a call, 8% of a
    4-element ``np.add``."""
    dt = arr.dtype
    if dt.kind not in "biufc" or not dt.isnative:
        return arr
    own = np.dtype(dt.type)
    return arr if dt is own else arr.view(own)


def value_info(
    value: ir.Value | None, const: Callable[[ir.Value], Any] | None = const_of
) -> ValueInfo | None:
    if value is None:
        return None
    shape = None
    if value.shape is not None:
        shape = tuple(_dim(d) for d in value.shape.dims)
    return ValueInfo(
        name=value.name or "",
        kind=value_kind(value.type),
        dtype=_elem_dtype(value.type),
        shape=shape,
        const=const(value) if const is not None else None,
    )


def attr_value(attr: ir.Attr, compile_graph: Callable[[ir.Graph], Any]) -> Any:
    t = attr.type
    v = attr.value
    if t == ir.AttributeType.GRAPH:
        return compile_graph(v)
    if t == ir.AttributeType.GRAPHS:
        return [compile_graph(g) for g in v]
    if t == ir.AttributeType.TENSOR:
        return v.numpy()
    if t == ir.AttributeType.TENSORS:
        return [x.numpy() for x in v]
    if t in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(v)
    return v


def free_values(graph: ir.Graph) -> list[ir.Value]:
    """Values a (sub)graph reads from enclosing scopes, in first-use order."""
    defined: set[int] = {id(v) for v in graph.inputs}
    defined.update(id(v) for v in graph.initializers.values())
    seen: set[int] = set()
    out: list[ir.Value] = []

    def visit(g: ir.Graph) -> None:
        for v in g.inputs:
            defined.add(id(v))
        for v in g.initializers.values():
            defined.add(id(v))
        for node in g:
            for v in node.inputs:
                if v is not None and id(v) not in defined and id(v) not in seen:
                    seen.add(id(v))
                    out.append(v)
            for a in node.attributes.values():
                if a.type == ir.AttributeType.GRAPH:
                    visit(a.value)
                elif a.type == ir.AttributeType.GRAPHS:
                    for sg in a.value:
                        visit(sg)
            for o in node.outputs:
                defined.add(id(o))
        for v in g.outputs:
            if id(v) not in defined and id(v) not in seen:
                seen.add(id(v))
                out.append(v)

    visit(graph)
    return out


def node_subgraphs(node: ir.Node) -> list[ir.Graph]:
    gs: list[ir.Graph] = []
    for a in node.attributes.values():
        if a.type == ir.AttributeType.GRAPH:
            gs.append(a.value)
        elif a.type == ir.AttributeType.GRAPHS:
            gs.extend(a.value)
    return gs


def implicit_inputs(node: ir.Node) -> list[ir.Value]:
    """Outer-scope values a node's subgraphs read, deduplicated in order."""
    seen: set[int] = set()
    out: list[ir.Value] = []
    for g in node_subgraphs(node):
        for v in free_values(g):
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def make_node_info(
    node: ir.Node,
    name: str,
    opsets: dict[str, int],
    compile_graph: Callable[[ir.Graph, list[ir.Value]], Any],
    const: Callable[[ir.Value], Any] = const_of,
) -> NodeInfo:
    implicit = implicit_inputs(node)
    subgraphs: dict[str, Any] = {}
    attrs: dict[str, Any] = {}

    def compile_one(g: ir.Graph) -> Any:
        return compile_graph(g, implicit)

    for key, attr in node.attributes.items():
        if attr.is_ref():
            continue
        value = attr_value(attr, compile_one)
        attrs[key] = value
        if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
            subgraphs[key] = value
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    opset = opsets.get(domain, opsets.get("ai.onnx" if domain == "" else domain, 1))
    return NodeInfo(
        op_type=node.op_type,
        domain=domain,
        name=name,
        opset=opset,
        attrs=attrs,
        inputs=tuple(value_info(v, const) for v in node.inputs),
        outputs=tuple(
            None if (o is None or not o.name) else value_info(o, None) for o in node.outputs
        ),
        subgraphs=subgraphs,
        implicit_inputs=tuple(v.name or "" for v in implicit),
        opsets=dict(opsets),
    )
