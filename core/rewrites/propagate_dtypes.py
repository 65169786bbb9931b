"""Type the values onnx's shape inference left untyped after contrib ops, before any fusion.

Walks each graph in order: a node with an untyped output gets its type from
the op's rule (:mod:`.contrib_dtypes`) when it is a contrib op, or from onnx's
own per-node inference when it is a standard op whose inputs are now typed,
so the types flow on past every contrib node. Only untyped outputs are
touched; a value whose type cannot be derived stays untyped, and the fusion
rules refuse it with their reason as before.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx_ir as ir

from .base import RewritePass
from .contrib_dtypes import output_rules, resolve

#: Constant inputs up to this many elements are handed to onnx's inference as data
#: (a Reshape's target shape, a Split's sizes), so it can also infer the shape.
_SMALL_CONST = 64
_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _unknown(dtype: ir.DataType | None) -> bool:
    return dtype is None or dtype == ir.DataType.UNDEFINED  # a declared elem_type of 0


def _untyped(v: ir.Value | None) -> bool:
    return v is not None and _unknown(v.dtype)


class PropagateContribDtypes(RewritePass):
    """Untyped outputs of contrib ops (and of standard ops after them) typed. ``count``: values."""

    name = "propagate_contrib_dtypes"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opsets = {("" if k == "ai.onnx" else k): v for k, v in model.opset_imports.items()}
        typed = self._graph(model.graph, opsets)
        self.count += typed
        return ir.passes.PassResult(model, typed > 0)

    def _graph(self, graph: ir.Graph, opsets: dict[str, int]) -> int:
        typed = 0
        for node in graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    typed += self._graph(attr.value, opsets)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for sub in attr.value:
                        typed += self._graph(sub, opsets)
            if not any(_untyped(v) for v in node.outputs):
                continue
            rules = output_rules(node)
            if rules is not None:
                typed += _apply_rules(node, rules)
            elif node.domain in ("", "ai.onnx"):
                typed += _infer_standard(node, opsets)
        return typed


def _apply_rules(node: ir.Node, rules: tuple) -> int:
    typed = 0
    for v, rule in zip(node.outputs, rules):
        if not _untyped(v):
            continue
        dtype, shape = resolve(rule, node)
        if _unknown(dtype):
            continue
        v.dtype = dtype
        if v.shape is None:
            v.shape = shape if shape is not None else _matmul_nbits_shape(node, v)
        typed += 1
    return typed


def _matmul_nbits_shape(node: ir.Node, v: ir.Value) -> ir.Shape | None:
    """MatMulNBits' output: A's shape with the last dim replaced by the N attribute."""
    if node.op_type != "MatMulNBits" or v is not node.outputs[0]:
        return None
    a, n = node.inputs[0], node.attributes.get("N")
    if a is None or a.shape is None or n is None or len(a.shape) == 0:
        return None
    return ir.Shape([*a.shape.dims[:-1], int(n.value)])


def _infer_standard(node: ir.Node, opsets: dict[str, int]) -> int:
    """Type ``node``'s untyped outputs with onnx's inference for its op; 0 when it cannot."""
    if any(a.type in _GRAPH_ATTRS for a in node.attributes.values()):
        return 0  # control flow: its subgraphs' outputs were typed (or not) above
    inputs = [v for v in node.inputs if v is not None]
    if any(_untyped(v) or not v.name for v in inputs):
        return 0
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get("", 1), "")
    except onnx.defs.SchemaError:
        return 0
    types = {v.name: _type_proto(v) for v in inputs}
    data = {v.name: _small_const(v) for v in inputs}
    try:
        out = onnx.shape_inference.infer_node_outputs(
            schema,
            ir.serde.serialize_node(node),
            types,
            {k: t for k, t in data.items() if t is not None},
            opset_imports=[onnx.helper.make_opsetid(d, o) for d, o in opsets.items()],
        )
    except Exception:
        return 0  # onnx's inference refused the node: its outputs stay untyped
    typed = 0
    for v in node.outputs:
        proto = out.get(v.name) if _untyped(v) and v.name else None
        if proto is None or not proto.HasField("tensor_type") or not proto.tensor_type.elem_type:
            continue
        v.dtype = ir.DataType(proto.tensor_type.elem_type)
        if v.shape is None and proto.tensor_type.HasField("shape"):
            v.shape = ir.serde.deserialize_type_proto_for_shape(proto)
        typed += 1
    return typed


def _type_proto(v: ir.Value) -> onnx.TypeProto:
    proto = onnx.TypeProto()
    proto.tensor_type.elem_type = int(v.dtype)
    if v.shape is not None:
        ir.serde.serialize_shape_into(proto, v.shape)
    return proto


def _small_const(v: ir.Value) -> Any:
    tensor = v.const_value
    if tensor is None or v.is_graph_input() or tensor.size > _SMALL_CONST:
        return None
    return ir.serde.serialize_tensor(tensor)
