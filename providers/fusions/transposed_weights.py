"""MatMul by a constant weight -> onnxep::MatMulNT over that weight transposed once, here.

A decode step multiplies one to a few rows of activations by each weight; a
GEMV that gives each output a warp reads that output's weights best as one
contiguous row, i.e. from ``W^T`` stored ``[N, K]``. This pass makes that copy
at session creation: a ``MatMul`` or ``onnxep::MatMulBias`` whose B is a
constant 2-D float16/float32 matrix becomes ``onnxep::MatMulNT(A, W^T[, bias])``
(one transposed copy per weight, shared by every node reading it; the
original initializer is dropped when nothing else reads it). A MatMulNT
whose only consumer is a one-input (packed) ``onnxep::SwiGLU`` then takes the
SwiGLU in (``activation="swiglu"``: the joined gate/up weight's rows hold the
gate rows, then the up rows), so it runs after ``fuse_shared_input_matmuls``,
last of the fusions.

Tolerance-level: the same math as the nodes it replaces, each result rounded
where they rounded, but the products sum in another order (a warp per output
on CUDA against cuBLAS; on the CPU the BLAS reads the transposed view with
its transpose flag).
"""

from __future__ import annotations

import onnx_ir as ir

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .graph_edits import drop_unread_initializers, new_initializer, take_over
from .naming import Names, graphs
from .reporting import GRAPH_OUTPUT, ReportingFusionPass, no_kernel

NOT_CONSTANT = "the weight is not a constant"
NOT_MATRIX = "the weight is not a 2-D matrix"
_TAKES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


def _is(node: ir.Node, domain: str, op_type: str) -> bool:
    d = "" if node.domain in ("", "ai.onnx") else node.domain
    return d == domain and node.op_type == op_type


def _activation(node: ir.Node) -> str:
    a = node.attributes.get("activation")
    return "none" if a is None else str(a.value)


class FuseTransposedWeights(ReportingFusionPass):
    """MatMul/MatMulBias by a constant matrix -> onnxep::MatMulNT on its transpose, with a
    packed SwiGLU after it folded in. Tolerance-level (see module)."""

    name = "fuse_transposed_weights"
    exact = False

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._names: Names | None = None
        self._transposed: dict[int, ir.Value] = {}  # id(weight) -> its transpose
        changed = False
        for graph in list(graphs(model.graph)):
            for node in list(graph):
                if node.graph is not graph or not self.owns(node):
                    continue
                if _is(node, "", "MatMul") or _is(node, DOMAIN, "MatMulBias"):
                    node = self._transpose(model, graph, node)
                    changed |= node is not None
                if node is not None and _is(node, DOMAIN, "MatMulNT"):
                    changed |= self._fold_swiglu(graph, node)
        return ir.passes.PassResult(model, changed)

    def _why_not(self, node: ir.Node) -> str | None:
        a, b = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        shape = C.const_shape(b)
        if shape is None:
            return NOT_CONSTANT
        if len(shape) != 2:
            return NOT_MATRIX
        if b.dtype not in _TAKES or (a is not None and a.dtype != b.dtype):
            return (
                f"operands of {C.dtype_name(a)} and {C.dtype_name(b)}, not one of float16 or float"
            )
        if _is(node, DOMAIN, "MatMulBias"):
            bias = node.inputs[2] if len(node.inputs) > 2 else None
            if bias is None or bias.dtype != b.dtype or C.rank(bias) != 1:
                return "the bias is not a vector of the weight's dtype"
        if not self.can_emit(DOMAIN, "MatMulNT"):
            return no_kernel(DOMAIN, "MatMulNT")
        return None

    def _transpose(self, model: ir.Model, graph: ir.Graph, node: ir.Node) -> ir.Node | None:
        why = self._why_not(node)
        if why:
            self.refuse(node, why)
            return None
        b = node.inputs[1]
        wt = self._transposed.get(id(b))
        if wt is None:
            wt = self._transposed[id(b)] = self._new_weight(model, graph, b)
        inputs = [node.inputs[0], wt, *node.inputs[2:3]]
        names = self._names_for(model)
        new = ir.node(
            "MatMulNT", inputs, {"activation": "none"}, domain=DOMAIN, name=node.name or None
        )
        if not new.name:
            new.name = names.fresh(f"{b.name or 'weight'}/MatMulNT")
        take_over(node.outputs[0], new.outputs[0])
        graph.insert_before(node, [new])
        graph.remove([node], safe=True)
        drop_unread_initializers([b])
        self.fire(node, "matmul_nt")
        return new

    def _new_weight(self, model: ir.Model, graph: ir.Graph, b: ir.Value) -> ir.Value:
        name = self._names_for(model).fresh(f"{b.name or 'weight'}/transposed")
        owner = b.graph if b.is_initializer() and b.graph is not None else graph
        return new_initializer(owner, name, C.const(b).T)

    def _fold_swiglu(self, graph: ir.Graph, node: ir.Node) -> bool:
        if _activation(node) != "none":
            return False
        y = node.outputs[0]
        uses = y.uses()
        if len(uses) != 1:
            return False  # not followed by a SwiGLU alone: nothing to fold, nothing refused
        consumer = uses[0].node
        if not _is(consumer, DOMAIN, "SwiGLU") or len(consumer.inputs) != 1:
            return False
        if y.is_graph_output():
            self.refuse(consumer, GRAPH_OUTPUT)
            return False
        if not self.owns(consumer):
            return False
        wt = C.const_shape(node.inputs[1])
        if wt is None or wt[0] % 2:
            self.refuse(consumer, "the weight has an odd number of rows (gate then up halves)")
            return False
        new = ir.node(
            "MatMulNT", list(node.inputs), {"activation": "swiglu"}, domain=DOMAIN, name=node.name
        )
        take_over(consumer.outputs[0], new.outputs[0])
        graph.insert_before(node, [new])
        graph.remove([node, consumer], safe=True)
        self.fire(consumer, "matmul_nt_swiglu")
        return True

    def _names_for(self, model: ir.Model) -> Names:
        if self._names is None:
            self._names = Names(model.graph)
        return self._names
