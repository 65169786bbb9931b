"""An 8-bit MatMulInteger and its float rescale -> com.microsoft DynamicQuantizeMatMul or
MatMulIntegerToFloat (what onnxruntime's own fusions of quantize_dynamic's output emit).

``onnxruntime.quantization.quantize_dynamic`` writes each float MatMul as

    q, s, z = DynamicQuantizeLinear(x)
    acc     = MatMulInteger(q, B, z, B_zero_point)
    y       = Mul(Cast(acc, to=float), Mul(s, B_scale))      [+ bias, an Add]

This pass matches from the MatMulInteger: its int32 result read only by a Cast to
float32, that only by a Mul whose other operand is the product of two scales, and,
where one follows alone, an Add of a constant bias vector. When A comes from a
DynamicQuantizeLinear whose outputs nothing else reads, all of it becomes
``DynamicQuantizeMatMul(x, B, B_scale, B_zero_point, bias)``; when that quantization
is shared (one DynamicQuantizeLinear feeding several products) or A is quantized some
other way, the product becomes ``MatMulIntegerToFloat(q, B, a_scale, B_scale, z,
B_zero_point, bias)``, with a_scale the scale product's scalar factor. Either way one
kernel writes float32 results from the integer product (on the CPU, in the 8-bit
tiles' epilogue) instead of an int32 tensor, a float copy, and two more passes.

Exact: the fused kernels quantize with DynamicQuantizeLinear's float32 operations
(the zero range aside: its scale 0 against their 1, where every product is 0 either
way), multiply the scales in float32 as the Mul does, and apply ``float32(acc) *
scale + bias`` as Cast, Mul and Add do; the integer product is exact in both.

A match is refused, with the reason, when an intermediate value is read elsewhere
or is a graph output, or a scale, zero point or bias is not per tensor or per column.
"""

from __future__ import annotations

import onnx_ir as ir

from . import rule_checks as C
from .graph_edits import take_over
from .graph_reads import other_operand, sole_reader
from .naming import graphs
from .quantized_swiglu import is_op
from .reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT, ReportingFusionPass, no_kernel

MS = "com.microsoft"
FLOAT = ir.DataType.FLOAT


def _size(v: ir.Value | None) -> int | None:
    """The number of elements, where the shape is known."""
    if v is None or v.shape is None:
        return None
    n = 1
    for k in range(len(v.shape)):
        d = C.dim(v, k)
        if not isinstance(d, int):
            return None
        n *= d
    return n


def _per_column(v: ir.Value | None, n: int | None, what: str) -> str | None:
    """``v`` is one value or a vector of N (per column), as the fused ops take it."""
    if v is None:
        return None
    size = _size(v)
    if (C.rank(v) or 0) > 1 or size is None:
        return f"the {what} is not one value or a vector over the columns"
    if size != 1 and (n is None or size != n):
        return f"the {what} has {size} values for {n} columns"
    return None


class FuseDynamicQuantizeMatMul(ReportingFusionPass):
    """(DynamicQuantizeLinear ->) MatMulInteger -> Cast -> Mul (-> Add bias) => com.microsoft
    DynamicQuantizeMatMul / MatMulIntegerToFloat. Exact (see module)."""

    name = "fuse_dynamic_quantize_matmul"
    exact = True

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = False
        for graph in list(graphs(model.graph)):
            for node in list(graph):
                if node.graph is graph and self.owns(node) and is_op(node, "", "MatMulInteger"):
                    changed |= self._fuse(graph, node)
        return ir.passes.PassResult(model, changed)

    def _fuse(self, graph: ir.Graph, mmi: ir.Node) -> bool:
        chain = _chain(mmi)
        if chain is None:
            return False  # not the rescale pattern: nothing to fuse, nothing refused
        cast, mul, scales, bias_add = chain
        nodes = [mmi, cast, mul] + ([bias_add] if bias_add is not None else [])
        if not all(self.owns(n) for n in [*nodes, scales]):
            return False  # another provider's
        a, b = mmi.inputs[0], mmi.inputs[1]
        a_zp = mmi.inputs[2] if len(mmi.inputs) > 2 else None
        b_zp = mmi.inputs[3] if len(mmi.inputs) > 3 else None
        n = C.dim(b, -1)
        n = n if isinstance(n, int) else None
        bias = None if bias_add is None else other_operand(bias_add, mul.outputs[0])
        dql = a.producer()
        quantized_here = (
            dql is not None
            and is_op(dql, "", "DynamicQuantizeLinear")
            and self.owns(dql)
            and a_zp is dql.outputs[2]
            and any(v is dql.outputs[1] for v in scales.inputs)
        )
        if quantized_here:
            a_scale = dql.outputs[1]
        else:
            a_scale = next((v for v in scales.inputs if _size(v) == 1), None)
        b_scale = None if a_scale is None else other_operand(scales, a_scale)
        why = (
            _escape(mmi.outputs[0], cast)
            or _escape(cast.outputs[0], mul)
            or (None if C.rank(b) == 2 else "B is not a matrix")
            or (None if a_scale is not None else "neither scale is known to be one value")
            or C.floats(a_scale, b_scale, mul.outputs[0])
            or (None if mul.outputs[0].dtype == FLOAT else "the result is not float32")
            or _per_column(b_scale, n, "B scale")
            or _per_column(b_zp, n, "B zero point")
            or (None if bias is None else _per_column(bias, n, "bias"))
            or (None if quantized_here or a_zp is None or _size(a_zp) == 1 else _A_ZP)
        )
        fold_dql = (
            why is None
            and quantized_here
            and b_scale.producer() is not dql
            and _reads_only(dql, mmi, scales)
        )
        op = "DynamicQuantizeMatMul" if fold_dql else "MatMulIntegerToFloat"
        if why is None and not self.can_emit(MS, op):
            why = no_kernel(MS, op)
        if why is not None:
            self.refuse(mmi, why)
            return False
        if fold_dql:
            inputs = [dql.inputs[0], b, b_scale, b_zp, bias]
        else:
            inputs = [a, b, a_scale, b_scale, a_zp, b_zp, bias]
        while inputs[-1] is None:
            inputs.pop()
        new = ir.node(op, inputs, {}, domain=MS, name=mmi.name)
        take_over(nodes[-1].outputs[0], new.outputs[0])
        graph.insert_after(nodes[-1], [new])  # after the match: a scale may be made late
        drop = nodes[::-1]
        m = scales.outputs[0]
        if not m.is_graph_output() and all(u.node is mul for u in m.uses()):
            drop.append(scales)  # else the scale product stays for its other readers
        if fold_dql:
            drop.append(dql)
        graph.remove(drop, safe=True)
        rule = "dynamic_quantize_matmul" if fold_dql else "matmul_integer_to_float"
        self.fire(mmi, rule + ("_bias" if bias_add is not None else ""))
        return True


_A_ZP = "A's zero point is not known to be one value (per tensor)"


def _escape(v: ir.Value, reader: ir.Node) -> str | None:
    """Why intermediate ``v`` (read by ``reader`` in the match) cannot disappear, or None."""
    if v.is_graph_output():
        return GRAPH_OUTPUT
    if any(u.node is not reader for u in v.uses()):
        return ANOTHER_CONSUMER
    return None


def _chain(mmi: ir.Node):
    """(Cast to float32, Mul by a product of scales, that product's Mul, the bias Add or None)
    reading ``mmi``'s result, or None where the result is not rescaled so."""
    cast = next((u.node for u in mmi.outputs[0].uses() if is_op(u.node, "", "Cast")), None)
    to = None if cast is None else cast.attributes.get("to")
    if to is None or int(to.value) != FLOAT.value:
        return None
    f = cast.outputs[0]
    for use in f.uses():
        mul = use.node
        if not is_op(mul, "", "Mul") or len(mul.inputs) != 2:
            continue
        scales = other_operand(mul, f).producer()
        if scales is not None and is_op(scales, "", "Mul") and len(scales.inputs) == 2:
            break
    else:
        return None
    add = sole_reader(mul.outputs[0])
    if add is not None and is_op(add, "", "Add") and len(add.inputs) == 2:
        bias = other_operand(add, mul.outputs[0])
        if C.const(bias) is not None and bias.dtype == FLOAT and (C.rank(bias) or 0) <= 1:
            return cast, mul, scales, add
    return cast, mul, scales, None


def _reads_only(dql: ir.Node, mmi: ir.Node, scales: ir.Node) -> bool:
    """Whether this product alone reads the DynamicQuantizeLinear's outputs (its values to
    the MatMulInteger, its scale to the scale product, which only the rescale reads)."""
    q, s, z = dql.outputs
    for v, reader in ((q, mmi), (z, mmi), (s, scales)):
        if v.is_graph_output() or any(u.node is not reader for u in v.uses()):
            return False
    m = scales.outputs[0]
    return not m.is_graph_output() and len(m.uses()) == 1
