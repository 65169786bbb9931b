"""ConvInteger -> (Add int32) -> Cast to float32 -> Mul => onnxep::ConvIntegerToFloat.

``onnxruntime.quantization.quantize_dynamic`` writes each float Conv as a ConvInteger
on dynamically quantized input whose int32 result gets the bias (quantized to int32
with the product of the scales), is cast to float32 and multiplied by that scale
product. This pass matches from the ConvInteger: its result read only by an Add of
an int32 value (optional) or directly by a Cast to float32, that only by a Mul by a
float32 value, and makes them one node
``ConvIntegerToFloat(x, w, x_zero_point, w_zero_point, scale, add)``. On the CPU
(VNNI tiles) the add and the scale happen as each result is written, when they are
one value or one per output channel; the int32 tensor, its sum and its float copy
are never made.

Exact: the fused kernels run the same int32 addition (wrapping alike), the same
rounding to float32 and the same float32 product, with NumPy's broadcasting where
the tiles do not take the operands' shapes.

Refused, with the reason, when an intermediate value is read elsewhere or is a graph
output, or an operand's dtype is not the one the pattern needs.
"""

from __future__ import annotations

import onnx_ir as ir

from ..ops.fused import DOMAIN
from .graph_edits import take_over
from .graph_reads import other_operand
from .naming import graphs
from .quantized_swiglu import attribute_values, is_op
from .reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT, ReportingFusionPass, no_kernel

FLOAT, INT32 = ir.DataType.FLOAT, ir.DataType.INT32


def _reader(v: ir.Value, domain: str, op: str) -> ir.Node | None:
    """A node of type ``op`` reading ``v``, else None."""
    for use in v.uses():
        if is_op(use.node, domain, op):
            return use.node
    return None


def _escape(v: ir.Value, reader: ir.Node) -> str | None:
    if v.is_graph_output():
        return GRAPH_OUTPUT
    if any(u.node is not reader for u in v.uses()):
        return ANOTHER_CONSUMER
    return None


class FuseConvIntegerToFloat(ReportingFusionPass):
    """ConvInteger (-> int32 Add) -> Cast -> Mul => onnxep::ConvIntegerToFloat. Exact (see
    module)."""

    name = "fuse_conv_integer_to_float"
    exact = True

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = False
        for graph in list(graphs(model.graph)):
            for node in list(graph):
                if node.graph is graph and self.owns(node) and is_op(node, "", "ConvInteger"):
                    changed |= self._fuse(graph, node)
        return ir.passes.PassResult(model, changed)

    def _fuse(self, graph: ir.Graph, conv: ir.Node) -> bool:
        acc = conv.outputs[0]
        add = _reader(acc, "", "Add")
        summed = acc if add is None else add.outputs[0]
        cast = _reader(summed, "", "Cast")
        to = None if cast is None else cast.attributes.get("to")
        if to is None or int(to.value) != FLOAT.value:
            return False  # not rescaled to float32: nothing to fuse, nothing refused
        mul = _reader(cast.outputs[0], "", "Mul")
        if mul is None or len(mul.inputs) != 2:
            return False
        nodes = [conv, *([add] if add is not None else []), cast, mul]
        if not all(self.owns(n) for n in nodes):
            return False  # another provider's
        addend = None if add is None else other_operand(add, acc)
        scale = other_operand(mul, cast.outputs[0])
        why = (
            _escape(acc, add if add is not None else cast)
            or (None if add is None else _escape(summed, cast))
            or _escape(cast.outputs[0], mul)
            or (None if addend is None or addend.dtype == INT32 else "the addend is not int32")
            or (None if scale.dtype == FLOAT else "the scale is not float32")
        )
        if why is None and not self.can_emit(DOMAIN, "ConvIntegerToFloat"):
            why = no_kernel(DOMAIN, "ConvIntegerToFloat")
        if why is not None:
            self.refuse(conv, why)
            return False
        ins = list(conv.inputs) + [None] * (4 - len(conv.inputs))
        inputs = [*ins[:4], scale, addend]
        while inputs[-1] is None:
            inputs.pop()
        new = ir.node(
            "ConvIntegerToFloat", inputs, attribute_values(conv), domain=DOMAIN, name=conv.name
        )
        take_over(mul.outputs[0], new.outputs[0])
        graph.insert_after(mul, [new])  # after the match: its scale may be made late
        graph.remove(nodes[::-1], safe=True)
        self.fire(conv, "conv_integer_add_to_float" if add is not None else "conv_integer_to_float")
        return True
