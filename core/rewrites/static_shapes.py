"""Static shapes onnx's inference at load could not see, once constants are folded.

onnx's shape inference runs once, at load, before anything is folded: a Pad whose pads
come from Slice/Transpose/Cast of constants (torch exports of a VAD's STFT padding), or
a Reshape whose target is computed, leaves every shape after it open, though the model's
inputs are fully static. After ``FoldConstants`` those inputs are constants, and onnx's
per-node inference gives the shapes; ``FoldConstants`` then folds the Shape and Size
nodes of them, and the comparisons and If nodes built on those (``InlineConstantIf``).
onnxruntime does the same when it resolves its graph.

Only the main graph, only when some Shape or Size node reads a value without a static
shape (so a model with nothing to gain pays nothing), and only outputs left open are
filled in, with shapes whose every dim is a number; the feeds' fixed dims are checked
at run time, so a static input shape holds.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from .base import RewritePass
from .propagate_dtypes import _small_const, _type_proto

_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def static(shape: ir.Shape | None) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape.dims)


def _wanted(graph: ir.Graph) -> bool:
    return any(
        n.op_type in ("Shape", "Size")
        and n.domain in ("", "ai.onnx")
        and n.inputs
        and n.inputs[0] is not None
        and not static(n.inputs[0].shape)
        for n in graph
    )


class InferStaticShapes(RewritePass):
    """Open output shapes filled in from static input shapes. ``count``: values."""

    name = "infer_static_shapes"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        if not _wanted(graph):
            return ir.passes.PassResult(model, False)
        opsets = {("" if k == "ai.onnx" else k): v for k, v in model.opset_imports.items()}
        found = 0
        for node in graph:
            found += _infer(node, opsets)
        self.count += found
        return ir.passes.PassResult(model, found > 0)


def _infer(node: ir.Node, opsets: dict[str, int]) -> int:
    open_outputs = [v for v in node.outputs if v is not None and v.name and not static(v.shape)]
    if not open_outputs or node.domain not in ("", "ai.onnx"):
        return 0
    if any(a.type in _GRAPH_ATTRS for a in node.attributes.values()):
        return 0
    inputs = [v for v in node.inputs if v is not None]
    if any(not v.name or v.dtype is None or not static(v.shape) for v in inputs):
        return 0
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get("", 1), "")
        data = {v.name: _small_const(v) for v in inputs}
        out = onnx.shape_inference.infer_node_outputs(
            schema,
            ir.serde.serialize_node(node),
            {v.name: _type_proto(v) for v in inputs},
            {k: t for k, t in data.items() if t is not None},
            opset_imports=[onnx.helper.make_opsetid(d, o) for d, o in opsets.items()],
        )
    except Exception:
        return 0  # onnx's inference refused the node: its shapes stay open
    found = 0
    for v in open_outputs:
        proto = out.get(v.name)
        if proto is None or not proto.HasField("tensor_type"):
            continue
        if not proto.tensor_type.HasField("shape"):
            continue
        shape = ir.serde.deserialize_type_proto_for_shape(proto)
        if not static(shape) or (v.shape is not None and len(v.shape) != len(shape)):
            continue
        if v.shape is not None and any(
            isinstance(a, int) and a != b for a, b in zip(v.shape.dims, shape.dims)
        ):
            continue  # disagrees with what load said: leave it to the run
        v.shape = shape
        found += 1
    return found
