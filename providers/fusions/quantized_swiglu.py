"""A joined gate/up MatMulNBits and the packed SwiGLU after it -> onnxep::MatMulNBits(swiglu).

``fuse_shared_input_matmuls`` joins an MLP's gate and up MatMulNBits into one whose output
feeds a one-input (packed) ``onnxep::SwiGLU``; this pass gives that product the SwiGLU as
its activation (onnxep::MatMulNBits: com.microsoft MatMulNBits's inputs and attributes
plus ``activation="swiglu"``), so a decode GEMV writes ``silu(gate) * up`` in its epilogue,
as ``fuse_transposed_weights`` does for float weights. It runs after the joins.

Exact: the fused kernels round where the two nodes rounded (the GEMV's output to the
storage type, then each SwiGLU step), and every provider's kernel of the fused op
multiplies with the unfused MatMulNBits's kernel.
"""

from __future__ import annotations

import onnx_ir as ir

from ..ops.fused import DOMAIN
from .graph_edits import take_over
from .naming import graphs
from .reporting import GRAPH_OUTPUT, ReportingFusionPass, no_kernel

MS = "com.microsoft"
ODD_N = "N is odd (the weight's rows are gate rows, then up rows)"


def is_op(node: ir.Node, domain: str, op_type: str) -> bool:
    d = "" if node.domain in ("", "ai.onnx") else node.domain
    return d == domain and node.op_type == op_type


def attribute_values(node: ir.Node) -> dict:
    """A node's attributes as plain values (for ``ir.node``)."""
    return {name: attr.value for name, attr in node.attributes.items()}


class FuseQuantizedSwiGLU(ReportingFusionPass):
    """MatMulNBits -> packed SwiGLU => onnxep::MatMulNBits(activation="swiglu"). Exact."""

    name = "fuse_quantized_swiglu"
    exact = True

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = False
        for graph in list(graphs(model.graph)):
            for node in list(graph):
                if node.graph is graph and self.owns(node) and is_op(node, MS, "MatMulNBits"):
                    changed |= self._fold(graph, node)
        return ir.passes.PassResult(model, changed)

    def _fold(self, graph: ir.Graph, node: ir.Node) -> bool:
        y = node.outputs[0]
        uses = y.uses()
        if len(uses) != 1:
            return False  # not followed by a SwiGLU alone: nothing to fold, nothing refused
        glu = uses[0].node
        if not is_op(glu, DOMAIN, "SwiGLU") or len(glu.inputs) != 1:
            return False
        if not self.owns(glu):
            return False  # another provider's
        why = None
        if y.is_graph_output():
            why = GRAPH_OUTPUT
        elif "N" not in node.attributes or int(node.attributes["N"].value) % 2:
            why = ODD_N
        elif not self.can_emit(DOMAIN, "MatMulNBits"):
            why = no_kernel(DOMAIN, "MatMulNBits")
        if why:
            self.refuse(glu, why)
            return False
        attrs = {**attribute_values(node), "activation": "swiglu"}
        new = ir.node("MatMulNBits", list(node.inputs), attrs, domain=DOMAIN, name=node.name)
        take_over(glu.outputs[0], new.outputs[0])
        graph.insert_before(node, [new])
        graph.remove([node, glu], safe=True)
        self.fire(glu, "matmul_nbits_swiglu")
        return True
