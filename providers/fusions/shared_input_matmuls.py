"""MatMuls reading the same input with constant weights -> one MatMul over the joined weights.

Q, K and V projections of one normalised input, or an MLP's gate and up
projections, become one GEMM over ``[W1 | W2 | ...]`` (concatenated here, at
session creation, into the row-major ``[K, N1 + N2 + ...]`` the GEMM reads;
the originals are dropped when nothing else reads them). The consumer splits
the result: a gate/up pair feeding one ``onnxep::SwiGLU`` becomes that
SwiGLU's packed input; any other group gets a Split along the last axis. The
same holds for ``onnxep::MatMulBias`` siblings, their biases joined too, and
for com.microsoft ``MatMulNBits`` siblings with the same K, bits, block_size,
accuracy_level and the same optional inputs (no g_idx): their B, scales, zero
points and bias are per output row, so joining them along N is concatenating
rows, and the kernels read the joined tables as one larger N.

Written by hand, not as an onnxscript pattern: the rule groups however many
consumers one value has, found from the value. A pattern can only say "N
MatMuls", one output node each, which onnxscript matches by trying every
combination of the graph's MatMuls (cubic in their number for three, and each
group once per order).

Tolerance-level: a GEMM over a wider N may take another algorithm (cuBLAS,
or the CPU BLAS's blocking), so an output column need not sum its products in
the same order as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .graph_edits import drop_unread_initializers, new_initializer, take_over
from .naming import Names, graphs
from .reporting import SPANS_PROVIDERS, ReportingFusionPass, no_kernel

MS = "com.microsoft"
_KINDS = {
    ("", "MatMul"): "MatMul",
    (DOMAIN, "MatMulBias"): "MatMulBias",
    (MS, "MatMulNBits"): "MatMulNBits",
}
NOT_CONSTANT = "a weight is not a constant matrix"
MIXED_DTYPES = "weights of different dtypes"
MIXED_NBITS = (
    "MatMulNBits siblings differ in K, bits, block_size, accuracy_level, scales dtype or "
    "which of zero_points and bias they have"
)
#: MatMulNBits inputs: A, B, scales, zero_points, g_idx, bias.
_ZP, _G_IDX, _BIAS = 3, 4, 5


def _kind(node: ir.Node) -> str | None:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    return _KINDS.get((domain, node.op_type))


class FuseSharedInputMatMuls(ReportingFusionPass):
    """Sibling MatMuls -> one MatMul and a split by the consumer. Tolerance-level (see module)."""

    name = "fuse_shared_input_matmuls"
    exact = False

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names: Names | None = None  # gathered at the first merge
        changed = False
        for graph in list(graphs(model.graph)):
            seen: set[int] = set()
            for node in list(graph):
                if node.graph is not graph or _kind(node) is None or node.inputs[0] is None:
                    continue
                x = node.inputs[0]
                if id(x) in seen:
                    continue
                seen.add(id(x))
                for group in self._groups(x, graph, node):
                    names = names or Names(model.graph)
                    self._merge(graph, x, group, names, node)
                    changed = True
        return ir.passes.PassResult(model, changed)

    def _groups(self, x: ir.Value, graph: ir.Graph, anchor: ir.Node) -> list[list[ir.Node]]:
        """The groups of ``x``'s MatMul consumers that can be joined (one per kind)."""
        siblings: list[ir.Node] = []
        for use in x.uses():
            n = use.node
            if use.idx == 0 and n.graph is graph and _kind(n) and n not in siblings:
                siblings.append(n)
        if len(siblings) < 2:
            return []
        owned = [n for n in siblings if self.owns(n)]
        if not owned:
            return []  # another provider's
        if len(owned) < len(siblings):
            self.refuse(anchor, SPANS_PROVIDERS)
        by_kind: dict[tuple[str, Any], list[ir.Node]] = {}
        for n in owned:
            why = _unfit(n, x)
            if why:
                self.refuse(n, why)  # the MatMul that stays out is the refused match
                continue
            by_kind.setdefault((_kind(n), _join_key(n)), []).append(n)
        dense = {key for kind, key in by_kind if kind != "MatMulNBits"}
        if len(dense) > 1:
            self.refuse(anchor, MIXED_DTYPES)
        if len([kind for kind, _ in by_kind if kind == "MatMulNBits"]) > 1:
            self.refuse(anchor, MIXED_NBITS)
        groups = []
        for (kind, _), members in by_kind.items():
            if len(members) < 2:
                continue
            emit = [(_DOMAINS[kind], kind), ("", "Split")]
            if not _packs_swiglu(members, self.owns):
                missing = [op for op in emit if not self.can_emit(*op)]
                if missing:
                    self.refuse(anchor, no_kernel(*missing[0]))
                    continue
            elif not self.can_emit(*emit[0]):
                self.refuse(anchor, no_kernel(*emit[0]))
                continue
            groups.append(members)
        return groups

    def _merge(
        self, graph: ir.Graph, x: ir.Value, group: list[ir.Node], names: Names, anchor: ir.Node
    ) -> None:
        order = {id(n): i for i, n in enumerate(graph)}
        first = min(group, key=lambda n: order[id(n)])  # the new nodes go before it
        packed = _packs_swiglu(group, self.owns)
        if packed is not None:
            group = packed[1]  # gate first: the packed input holds gate, then up
        else:
            group = sorted(group, key=lambda n: order[id(n)])
        stem = first.name or first.op_type
        if _kind(first) == "MatMulNBits":
            inputs, attrs, sizes = _joined_nbits(graph, names, stem, x, group)
        else:
            weights = [C.const(n.inputs[1]) for n in group]
            sizes = [int(w.shape[1]) for w in weights]
            inputs = [x, _initializer(graph, names, f"{stem}/joined_weight", weights)]
            attrs = {}
            if _kind(first) == "MatMulBias":
                biases = [C.const(n.inputs[2]) for n in group]
                inputs.append(_initializer(graph, names, f"{stem}/joined_bias", biases, axis=0))
        merged = ir.node(
            first.op_type, inputs, attrs, domain=first.domain, name=names.fresh(f"{stem}/joined")
        )
        out = merged.outputs[0]
        out.name = names.fresh(f"{stem}/joined_out")
        out.type = first.outputs[0].type
        if x.shape is not None:
            out.shape = ir.Shape([*x.shape.dims[:-1], sum(sizes)])
        weight_values = [v for n in group for v in n.inputs[1:]]
        if packed is not None:
            consumer = packed[0]
            new = ir.node("SwiGLU", [out], domain=DOMAIN, name=consumer.name)
            take_over(consumer.outputs[0], new.outputs[0])
            graph.insert_before(first, [merged, new])
            graph.remove([*group, consumer], safe=True)
            rule = "joined_into_swiglu"
        else:
            split = self._split(graph, names, stem, out, sizes)
            for old, new_out in zip([n.outputs[0] for n in group], split.outputs):
                take_over(old, new_out)
            graph.insert_before(first, [merged, split])
            graph.remove(group, safe=True)
            rule = "joined_and_split"
        drop_unread_initializers(weight_values)
        self.fire(anchor, rule)

    def _split(
        self, graph: ir.Graph, names: Names, stem: str, out: ir.Value, sizes: list[int]
    ) -> ir.Node:
        name = names.fresh(f"{stem}/split")
        if self.opsets.get("", 1) >= 13:
            sz = _initializer(graph, names, f"{stem}/split_sizes", [np.array(sizes, np.int64)])
            return ir.node("Split", [out, sz], {"axis": -1}, num_outputs=len(sizes), name=name)
        return ir.node(
            "Split", [out], {"axis": -1, "split": sizes}, num_outputs=len(sizes), name=name
        )


_DOMAINS = {kind: domain for (domain, _), kind in _KINDS.items()}


def _join_key(n: ir.Node) -> Any:
    """What siblings of one kind must share to be joined (beyond reading the same input)."""
    if _kind(n) != "MatMulNBits":
        return n.inputs[1].dtype
    attrs = tuple(_int_attr(n, a, d) for a, d in _NBITS_ATTRS)
    wired = tuple(_input(n, i) is not None for i in (_ZP, _BIAS))
    zp = _input(n, _ZP)
    # Entries per output row (rows may be padded): only equal widths concatenate row-wise.
    widths = tuple(_row_width(n, i) for i in (2, _ZP))
    return (attrs, n.inputs[2].dtype, wired, None if zp is None else zp.dtype, widths)


def _row_width(n: ir.Node, i: int) -> int | None:
    shape = C.const_shape(_input(n, i))
    return None if shape is None else int(np.prod(shape)) // max(_int_attr(n, "N", 1) or 1, 1)


#: The MatMulNBits attributes siblings must share, with their defaults (N is summed).
_NBITS_ATTRS = (("K", None), ("bits", 4), ("block_size", None), ("accuracy_level", 0))


def _int_attr(n: ir.Node, name: str, default: int | None) -> int | None:
    a = n.attributes.get(name)
    return default if a is None else int(a.value)


def _input(n: ir.Node, i: int) -> ir.Value | None:
    return n.inputs[i] if i < len(n.inputs) else None


def _unfit_nbits(n: ir.Node, x: ir.Value) -> str | None:
    """Why a MatMulNBits consumer of ``x`` cannot join its siblings, or None."""
    if _input(n, _G_IDX) is not None:
        return "a MatMulNBits with g_idx (its quantization groups are reordered)"
    if _int_attr(n, "weight_prepacked", 0):
        return "a MatMulNBits with a prepacked weight"
    b, scales = C.const_shape(_input(n, 1)), C.const_shape(_input(n, 2))
    if b is None or scales is None:
        return "a MatMulNBits weight or its scales are not constants"
    rows = _int_attr(n, "N", None)
    if rows is None or len(b) != 3 or b[0] != rows:
        return "a MatMulNBits weight does not hold N rows of blocks"
    zp = _input(n, _ZP)
    if zp is not None and C.const_shape(zp) is None:
        return "a MatMulNBits has zero points that are not constants"
    bias = _input(n, _BIAS)
    if bias is not None and C.const_shape(bias) not in ((rows,), None):
        return "a MatMulNBits bias is not a vector of N values"
    if bias is not None and C.const_shape(bias) is None:
        return "a MatMulNBits bias is not a constant"
    if n.inputs[2].dtype != x.dtype:
        return MIXED_DTYPES
    return None


def _joined_nbits(
    graph: ir.Graph, names: Names, stem: str, x: ir.Value, group: list[ir.Node]
) -> tuple[list[ir.Value | None], dict[str, Any], list[int]]:
    """The joined MatMulNBits' inputs, attributes and each member's N.

    B is (N, blocks, blob); scales and zero points hold one row of entries per
    output row (flat or 2-D, each row possibly padded): every table is joined
    row-wise, keeping the members' rank.
    """
    sizes = [_int_attr(n, "N", None) for n in group]
    inputs: list[ir.Value | None] = [
        x,
        _initializer(
            graph, names, f"{stem}/joined_weight", [C.const(n.inputs[1]) for n in group], 0
        ),
    ]
    for i, what in ((2, "scales"), (_ZP, "zero_points")):
        if _input(group[0], i) is None:
            inputs.append(None)
            continue
        parts = [C.const(n.inputs[i]) for n in group]
        flat = all(p.ndim == 1 for p in parts)
        rows = [p.reshape(sz, -1) for p, sz in zip(parts, sizes)]
        joined = np.concatenate(rows, axis=0)
        inputs.append(
            _initializer(
                graph, names, f"{stem}/joined_{what}", [joined.reshape(-1) if flat else joined]
            )
        )
    inputs.append(None)  # g_idx
    if _input(group[0], _BIAS) is not None:
        biases = [C.const(n.inputs[_BIAS]).reshape(-1) for n in group]
        inputs.append(_initializer(graph, names, f"{stem}/joined_bias", biases, axis=0))
    while inputs[-1] is None:
        inputs.pop()
    attrs = {name: a.value for name, a in group[0].attributes.items()}
    attrs["N"] = sum(sizes)
    return inputs, attrs, sizes


def _unfit(n: ir.Node, x: ir.Value) -> str | None:
    """Why a MatMul consumer of ``x`` cannot join its siblings, or None."""
    if _kind(n) == "MatMulNBits":
        return _unfit_nbits(n, x)
    w = C.const_shape(n.inputs[1]) if len(n.inputs) > 1 else None
    if w is None or len(w) != 2:
        return NOT_CONSTANT
    if n.inputs[1].dtype != x.dtype:
        return MIXED_DTYPES
    if _kind(n) == "MatMulBias":
        b = C.const_shape(n.inputs[2]) if len(n.inputs) > 2 else None
        if b != (w[1],):
            return "a bias is not a constant vector"
    return None


def _packs_swiglu(group: list[ir.Node], owns: Any) -> tuple[ir.Node, list[ir.Node]] | None:
    """The one onnxep::SwiGLU (of this provider) that alone reads the pair's outputs as (gate,
    up), and the pair in that order; None for any other group."""
    if len(group) != 2:
        return None
    outs = [n.outputs[0] for n in group]
    if any(o.is_graph_output() or len(o.uses()) != 1 for o in outs):
        return None
    consumer = outs[0].uses()[0].node
    if consumer.op_type != "SwiGLU" or consumer.domain != DOMAIN or len(consumer.outputs) != 1:
        return None
    if not owns(consumer):
        return None
    if list(consumer.inputs) == outs:
        return consumer, list(group)
    if list(consumer.inputs) == outs[::-1]:
        return consumer, [group[1], group[0]]
    return None


def _initializer(
    graph: ir.Graph, names: Names, stem: str, parts: list[np.ndarray], axis: int = 1
) -> ir.Value:
    arr = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
    return new_initializer(graph, names.fresh(stem), arr)
