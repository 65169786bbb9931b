"""An RMS norm and the one GEMV reading it -> onnxep::NormMatMulNT / onnxep::NormMatMulNBits.

A decoder layer normalises the residual stream and multiplies it by the joined Q/K/V or
gate/up weights; on CUDA the norm is a launch of its own. This pass folds a
``SimplifiedLayerNormalization`` (last axis, float32 statistics, its inv_std_var unread) or a
com.microsoft ``SkipSimplifiedLayerNormalization`` (its mean and inv_std_var unread; the
residual sum may be read) into the onnxep::MatMulNT, com.microsoft MatMulNBits or
onnxep::MatMulNBits that is its output's only reader, as that GEMV's A. The fused node
takes the norm's inputs ``(x, skip, gamma, norm_bias)`` then the GEMV's other inputs, and
gives the GEMV's output and the residual sum (``providers/ops/norm_prologue.py``); on CUDA
the GEMV normalises its rows in a prologue, the skip-add included, one launch instead of
two. The GEMV's other inputs must not be computed in the graph (weights, scales and biases
are initializers): the fused node takes the norm's place. Runs last, after the passes that
make MatMulNT and onnxep::MatMulNBits.

Exact: every provider's kernel of the fused ops normalises as its norm kernel does (the
generic kernels are the two nodes' own; the CUDA prologue follows ``norm_rows`` step for
step and in its reduction order) and multiplies with the GEMV's kernel.
"""

from __future__ import annotations

import onnx_ir as ir

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .graph_edits import take_over
from .naming import graphs
from .quantized_swiglu import attribute_values, is_op
from .reporting import (
    ANOTHER_CONSUMER,
    GRAPH_OUTPUT,
    SPANS_PROVIDERS,
    ReportingFusionPass,
    no_kernel,
)

MS = "com.microsoft"
#: The GEMVs a norm folds into, by (domain, op), and the fused op each becomes.
GEMVS = {
    (DOMAIN, "MatMulNT"): "NormMatMulNT",
    (MS, "MatMulNBits"): "NormMatMulNBits",
    (DOMAIN, "MatMulNBits"): "NormMatMulNBits",
}
#: SimplifiedLayerNormalization's default epsilon, and SkipSimplifiedLayerNormalization's.
EPSILON = {"SimplifiedLayerNormalization": 1e-5, "SkipSimplifiedLayerNormalization": 1e-12}
COMPUTED_INPUT = "an input of the GEMV besides A is computed in the graph"
STATISTICS_READ = "the norm's statistics (mean or inv_std_var) are read"


def _kind(node: ir.Node) -> str | None:
    """Which norm ``node`` is (its op type), or None."""
    if is_op(node, "", "SimplifiedLayerNormalization") or is_op(
        node, MS, "SimplifiedLayerNormalization"
    ):
        return "SimplifiedLayerNormalization"
    if is_op(node, MS, "SkipSimplifiedLayerNormalization"):
        return "SkipSimplifiedLayerNormalization"
    return None


def _gemv_op(node: ir.Node) -> str | None:
    d = "" if node.domain in ("", "ai.onnx") else node.domain
    return GEMVS.get((d, node.op_type))


def _read(v: ir.Value | None) -> bool:
    return v is not None and (bool(v.uses()) or v.is_graph_output())


class FuseNormMatMul(ReportingFusionPass):
    """(Skip)SimplifiedLayerNormalization -> its one GEMV => onnxep::NormMatMul*. Exact."""

    name = "fuse_norm_matmul"
    exact = True

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = False
        for graph in list(graphs(model.graph)):
            for node in list(graph):
                if node.graph is not graph or not self.owns(node):
                    continue
                kind = _kind(node)
                if kind is not None:
                    changed |= self._fold(graph, node, kind)
        return ir.passes.PassResult(model, changed)

    def _gemv(self, node: ir.Node) -> tuple[ir.Node | None, str | None]:
        """The GEMV reading the norm's output and why it cannot take the norm in (or None,
        None: no GEMV reads it, nothing to refuse)."""
        y = node.outputs[0]
        uses = y.uses()
        gemvs = [u.node for u in uses if u.idx == 0 and _gemv_op(u.node) is not None]
        if not gemvs:
            return None, None
        gemv = gemvs[0]
        if len(uses) > 1:
            return gemv, ANOTHER_CONSUMER
        if y.is_graph_output():
            return gemv, GRAPH_OUTPUT
        if not self.owns(gemv):
            return gemv, SPANS_PROVIDERS
        if any(v is not None and v.producer() is not None for v in gemv.inputs[1:]):
            return gemv, COMPUTED_INPUT
        return gemv, None

    def _why_not(self, node: ir.Node, kind: str) -> str | None:
        """Why the norm itself cannot fold (its form), or None."""
        x = node.inputs[0] if node.inputs else None
        if x is None or (why := C.floats(x)):
            return why or "the norm has no input"
        if kind == "SimplifiedLayerNormalization":
            stash = node.attributes.get("stash_type")
            if not C.last_axis(node, x):
                return "the norm is not over the last axis alone"
            if stash is not None and stash.value != 1:
                return "statistics are not float32"
            if len(node.inputs) < 2 or node.inputs[1] is None:
                return "the norm has no scale"
            if _read(node.outputs[1] if len(node.outputs) > 1 else None):
                return STATISTICS_READ
            return None
        if len(node.inputs) < 3 or any(v is None for v in node.inputs[:3]):
            return "the norm lacks its skip or gamma"
        if any(_read(node.outputs[j] if len(node.outputs) > j else None) for j in (1, 2)):
            return STATISTICS_READ
        return None

    def _fold(self, graph: ir.Graph, node: ir.Node, kind: str) -> bool:
        gemv, why = self._gemv(node)
        if gemv is None:
            return False
        fused = _gemv_op(gemv)
        why = why or self._why_not(node, kind)
        if why is None and not self.can_emit(DOMAIN, fused):
            why = no_kernel(DOMAIN, fused)
        if why:
            self.refuse(node, why)
            return False
        ins = list(node.inputs)
        if kind == "SimplifiedLayerNormalization":
            norm_in = [ins[0], None, ins[1], None]
        else:
            norm_in = [ins[0], ins[1], ins[2], ins[3] if len(ins) > 3 else None]
        eps = node.attributes.get("epsilon")
        attrs = {"epsilon": EPSILON[kind] if eps is None else float(eps.value)}
        attrs.update(attribute_values(gemv))
        inputs = norm_in + list(gemv.inputs[1:])
        while inputs and inputs[-1] is None:
            inputs.pop()
        skip = kind == "SkipSimplifiedLayerNormalization"
        total = node.outputs[3] if skip and len(node.outputs) > 3 else None
        keep_sum = _read(total)
        new = ir.node(
            fused, inputs, attrs, domain=DOMAIN, num_outputs=2 if keep_sum else 1,
            name=gemv.name or None,
        )  # fmt: skip
        take_over(gemv.outputs[0], new.outputs[0])
        if keep_sum:
            take_over(total, new.outputs[1])
        graph.insert_before(node, [new])
        graph.remove([node, gemv], safe=True)
        self.fire(node, "norm_matmul_nt" if fused == "NormMatMulNT" else "norm_matmul_nbits")
        return True
