"""Axis attributes checked against the ranks shape inference found, at session creation.

An ``axis`` (or ``axes``) attribute out of range for its input's rank would
otherwise fail at the first run inside a kernel. The rule is generic: an
``axis`` must lie in ``[-r, r-1]`` and every ``axes`` entry likewise, where
``r`` is the rank of the node's first input; the ops listed in ``_RANK_OF``
measure the range differently (as their specs say), and ``_SKIP`` lists ops
whose ``axis`` means something else. Nodes whose rank is unknown are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx
from onnx import AttributeProto

from .errors import InvalidModel
from .proto_checks import node_label
from .schema_checks import canonical_domain, op_schema

#: Opset-1..6 binary ops with legacy broadcasting: their ``axis`` places the
#: second input inside the first and is ignored without ``broadcast=1``.
#: ConcatFromSequence's input is a sequence, whose elements' rank is not tracked.
_SKIP = frozenset(
    {"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"}
    | {"ConcatFromSequence"}
)

Ranks = dict[str, int]


def _flatten(node: onnx.NodeProto, ranks: Ranks, axes: list[int]) -> tuple[int, int] | None:
    r = ranks.get(node.input[0]) if node.input else None
    return None if r is None else (-r, r)  # Flatten's axis may equal the rank


def _unsqueeze(node: onnx.NodeProto, ranks: Ranks, axes: list[int]) -> tuple[int, int] | None:
    r = ranks.get(node.input[0]) if node.input else None
    return None if r is None else (-(r + len(axes)), r + len(axes) - 1)  # the output's rank


def _one_hot(node: onnx.NodeProto, ranks: Ranks, axes: list[int]) -> tuple[int, int] | None:
    r = ranks.get(node.input[0]) if node.input else None
    return None if r is None else (-(r + 1), r)  # the output gains the one-hot axis


def _quantize(node: onnx.NodeProto, ranks: Ranks, axes: list[int]) -> tuple[int, int] | None:
    # With a scalar scale (per-tensor quantization) the spec ignores axis; onnxruntime also
    # reads a one-element scale of any rank as per-tensor (its optimizer writes such models).
    scale_name = node.input[1] if len(node.input) > 1 else ""
    scale = ranks.get(scale_name)
    if not scale or scale_name in getattr(ranks, "single", ()):
        return None
    return _generic(node, ranks, axes)


def _generic(node: onnx.NodeProto, ranks: Ranks, axes: list[int]) -> tuple[int, int] | None:
    r = ranks.get(node.input[0]) if node.input else None
    return None if r is None else (-r, r - 1)


_RANK_OF: dict[str, Callable[[onnx.NodeProto, Ranks, list[int]], tuple[int, int] | None]] = {
    "Flatten": _flatten,
    "Unsqueeze": _unsqueeze,
    "OneHot": _one_hot,
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _quantize,
}


def _rank(t: onnx.TypeProto) -> int | None:
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return len(t.tensor_type.shape.dim)


class _Ranks(dict):
    """Value name -> rank, and ``single``: the values known to hold one element."""

    single: set[str]


def _graph_ranks(graph: onnx.GraphProto, outer: Ranks) -> Ranks:
    ranks = _Ranks(outer)
    ranks.single = set(getattr(outer, "single", ()))
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        r = _rank(vi.type)
        if r is not None:
            ranks[vi.name] = r
            dims = vi.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") and d.dim_value == 1 for d in dims):
                ranks.single.add(vi.name)
    for t in graph.initializer:
        ranks[t.name] = len(t.dims)
        if all(d == 1 for d in t.dims):
            ranks.single.add(t.name)
    return ranks


def check_axes(proto: onnx.ModelProto) -> None:
    """Refuse an ``axis``/``axes`` attribute outside its input's known rank (see module doc)."""
    opsets = {canonical_domain(o.domain): o.version for o in proto.opset_import}
    for node, index, ranks, where in _walk(proto.graph, {}, f"graph {proto.graph.name!r}"):
        if node.op_type in _SKIP or canonical_domain(node.domain) != "":
            continue
        if op_schema(node.op_type, opsets.get("", 0), "") is None:
            continue  # not an ONNX op: its attributes are its provider's business
        for attr in node.attribute:
            if node.op_type == "Transpose" and attr.name == "perm":
                _check_perm(node, index, ranks, where, list(attr.ints))
                continue
            if attr.name == "axis" and attr.type == AttributeProto.INT:
                values = [attr.i]
            elif attr.name == "axes" and attr.type == AttributeProto.INTS:
                values = list(attr.ints)
            else:
                continue
            bounds = _RANK_OF.get(node.op_type, _generic)(node, ranks, values)
            if bounds is None:
                continue
            lo, hi = bounds
            bad = [v for v in values if not lo <= v <= hi]
            if bad:
                r = ranks.get(node.input[0])
                raise InvalidModel(
                    f"{node_label(node, index, where)} (opset {opsets.get('', 0)}): attribute "
                    f"{attr.name!r} = {values[0] if attr.name == 'axis' else values} is out "
                    f"of range; input {node.input[0]!r} has rank {r}, so it must lie in "
                    f"[{lo}, {hi}]"
                )


def _check_perm(node: onnx.NodeProto, index: int, ranks: Ranks, where: str, perm: list[int]):
    r = ranks.get(node.input[0]) if node.input else None
    if r is not None and sorted(perm) != list(range(r)):
        raise InvalidModel(
            f"{node_label(node, index, where)}: attribute 'perm' = {perm} is not a "
            f"permutation of the axes of input {node.input[0]!r}, which has rank {r}"
        )


def _walk(
    graph: onnx.GraphProto, outer: Ranks, where: str
) -> Iterator[tuple[onnx.NodeProto, int, Ranks, str]]:
    ranks = _graph_ranks(graph, outer)
    for index, node in enumerate(graph.node):
        yield node, index, ranks, where
        for attr in node.attribute:
            subs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                inner = f"{where} > {node.op_type} {node.name!r} attribute {attr.name!r}"
                yield from _walk(sub, ranks, inner)
