"""Evaluate nodes whose inputs are all constants, Shape/Size of static shapes, and a
Gather of a Shape's static dims.

Folding runs the host provider's own kernels, so a folded value is exactly
what the node would have computed at run time. ``FoldConstants`` folds the
main graph; ``FoldSubgraphConstants`` the bodies of If, Loop and Scan, whose
exporters often build weights there from constants on every run (slices and
concats of an LSTM's gates, Constant nodes): a folded value becomes an
initializer of that subgraph, and a value read from the enclosing scope folds
when it is an initializer there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from onnxep.providers.provider import Claim

from ..compile.nodeinfo import make_node_info
from .base import RewritePass

_RANDOM = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
}


def _const(v: ir.Value | None) -> Any:
    if v is None:
        return None
    if v.is_graph_input() or v.const_value is None:
        raise LookupError
    return v.const_value.numpy()


class FoldConstants(RewritePass):
    """Replace constant subexpressions by initializers.

    An output is folded when it is no larger than the constants it is computed
    from, or no larger than ``max_elements``.
    """

    name = "fold_constants"

    def __init__(self, provider: Any, max_elements: int = 1 << 22) -> None:
        super().__init__()
        self.provider = provider
        self.max_elements = max_elements

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = self._fold(model.graph, dict(model.opset_imports))
        return ir.passes.PassResult(model, changed)

    def _fold(self, graph: ir.Graph, opsets: dict[str, int]) -> bool:
        outputs = {id(v) for v in graph.outputs}
        changed = False
        for index, node in enumerate(list(graph)):
            if any(id(o) in outputs for o in node.outputs):
                continue
            values = self._evaluate(node, index, opsets)
            if values is None:
                continue
            self._replace(graph, node, values)
            self.count += 1
            changed = True
        return changed

    def _evaluate(self, node: ir.Node, index: int, opsets: dict[str, int]) -> list | None:
        if node.op_type in _RANDOM or any(
            a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
            for a in node.attributes.values()
        ):
            return None
        if node.domain in ("", "ai.onnx") and node.op_type in ("Shape", "Size"):
            return self._shape_fold(node)
        if node.domain in ("", "ai.onnx") and node.op_type == "Gather" and SHAPE_DIMS:
            dims = _shape_dims(node)
            if dims is not None:
                return dims
        try:
            inputs = [_const(v) for v in node.inputs]
        except LookupError:
            return None
        if not inputs and node.op_type != "Constant":
            return None
        info = make_node_info(node, node.name or f"{node.op_type}_{index}", opsets, _no_subgraph)
        claim = self.provider.claim(info)
        if not isinstance(claim, Claim):
            return None
        try:
            out = list(claim.fn(*inputs))
        except Exception:
            return None  # the run will raise it with the node's name
        # a 0-d result may come back as a NumPy scalar (x.take of a scalar index: a Gather
        # of one dim of a Shape), which is the 0-d array's value
        out = [np.asarray(o) if isinstance(o, np.generic) else o for o in out]
        if len(out) < len(node.outputs) or not all(isinstance(o, np.ndarray) for o in out):
            return None
        # An output no larger than the inputs it came from (a Transpose or Cast of a
        # weight) always folds; one that grows past the cap (Expand, Tile) does not.
        if sum(o.size for o in out) > max(self.max_elements, sum(np.size(i) for i in inputs)):
            return None
        return out

    @staticmethod
    def _shape_fold(node: ir.Node) -> list | None:
        x = node.inputs[0]
        if x is None or x.shape is None or not all(isinstance(d, int) for d in x.shape.dims):
            return None
        dims = [int(d) for d in x.shape.dims]
        if node.op_type == "Size":
            return [np.array(int(np.prod(dims)), dtype=np.int64)]
        s, e = _shape_span(node, len(dims))
        return [np.array(dims[s:e], dtype=np.int64)]

    @staticmethod
    def _replace(graph: ir.Graph, node: ir.Node, values: list) -> None:
        olds = list(node.outputs)
        # a folded node read from another node (a Gather of a Shape's static dims): that
        # node loses this use, so dead-node removal can take it
        for i, v in enumerate(node.inputs):
            if v is not None and v.producer() is not None:
                node.replace_input_with(i, None)
        graph.remove(node, safe=False)
        for o, arr in zip(olds, values):
            if not o.uses():
                continue
            # Kernels may return views (Transpose does); a constant is read on every
            # run, so it is stored contiguous once rather than gathered from strides.
            if not arr.flags.c_contiguous:
                arr = arr.copy(order="C")
            new = ir.Value(name=o.name, const_value=ir.tensor(arr, name=o.name))
            new.type = ir.TensorType(ir.DataType.from_numpy(arr.dtype))
            new.shape = ir.Shape(arr.shape)
            o.replace_all_uses_with(new)
            graph.register_initializer(new)


#: Whether a Gather of a Shape's static dims folds (an A/B switch for the benchmarks).
SHAPE_DIMS = True


def _shape_dims(node: ir.Node) -> list | None:
    """``Gather(Shape(x), i)`` (axis 0, ``i`` constant) when the dims it picks are static,
    though others of x's are not: torch's ``chunk`` of a [batch, 3H] Gemm output computes
    its Slice bounds from ``Shape(y)[1]`` (a GRU cell's gates), which left those Slices'
    starts and ends run-time values, their chains of Add/Div/Mul too. onnxruntime folds
    the same (its Shape of partially known dims). The dims are those onnx's inference
    gave at load; the feeds' fixed dims are checked at run time."""
    data = node.inputs[0] if node.inputs else None
    shape_node = data.producer() if data is not None else None
    if (
        shape_node is None
        or shape_node.op_type != "Shape"
        or shape_node.domain not in ("", "ai.onnx")
        or len(node.inputs) < 2
    ):
        return None
    axis = node.attributes.get("axis")
    x = shape_node.inputs[0]
    if (axis is not None and axis.value != 0) or x is None or x.shape is None:
        return None
    try:
        index = _const(node.inputs[1])
    except LookupError:
        return None
    if index is None or index.dtype.kind not in "iu":
        return None
    dims = list(x.shape.dims)
    s, e = _shape_span(shape_node, len(dims))
    dims = dims[s:e]
    picked = []
    for i in index.reshape(-1).tolist():
        i = i + len(dims) if i < 0 else i
        if not 0 <= i < len(dims) or not isinstance(dims[i], int):
            return None  # out of range (the run says so) or not static
        picked.append(int(dims[i]))
    return [np.array(picked, dtype=np.int64).reshape(index.shape)]


def _shape_span(node: ir.Node, rank: int) -> tuple[int, int]:
    """The dims a Shape node returns (its start and end, clamped as opset 15 says)."""
    start = node.attributes.get("start")
    end = node.attributes.get("end")
    s = start.value if start is not None else 0
    e = end.value if end is not None else rank
    return min(max(s + rank if s < 0 else s, 0), rank), min(max(e + rank if e < 0 else e, 0), rank)


def _no_subgraph(*_: Any) -> Any:
    raise AssertionError("folded nodes have no subgraphs")


class FoldSubgraphConstants(FoldConstants):
    """Fold constant subexpressions inside subgraphs (If branches, Loop and Scan bodies),
    at every depth; the main graph is ``FoldConstants``'s."""

    name = "fold_subgraph_constants"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opsets = dict(model.opset_imports)
        changed = False
        for sub in _subgraphs(model.graph):
            changed |= self._fold(sub, opsets)
        return ir.passes.PassResult(model, changed)


def _subgraphs(graph: ir.Graph) -> list[ir.Graph]:
    """Every subgraph below ``graph``, each before the ones nested in it."""
    found: list[ir.Graph] = []
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                subs = [attr.value]
            elif attr.type == ir.AttributeType.GRAPHS:
                subs = list(attr.value)
            else:
                continue
            for sub in subs:
                found.append(sub)
                found += _subgraphs(sub)
    return found
