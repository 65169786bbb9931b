"""Fold an inference-mode BatchNormalization, and per-channel Mul/Add by constants, into the
Conv they follow.

``BN(Conv(x, W, b))`` with constant scale ``g``, bias ``B``, mean ``m`` and
variance ``v`` is ``Conv(x, W * s, (b - m) * s + B)`` per output channel, with
``s = g / sqrt(v + epsilon)``; a Mul by a constant ``c`` of per-channel shape
scales ``W`` and ``b`` by ``c``, an Add of one adds it to ``b``. Exporters
write those after a convolution (a BatchNorm2d exported in eval mode without
constant folding; a frozen batch norm as Mul and Add). The folded weights are
computed in float64 and cast back to the weight's dtype, so the fold rounds
once where the unfused graph rounds at every op: equal within the dtype's
tolerance, not bit for bit.

A BatchNormalization after a Conv is refused, with its reason in the
placement report, when it has training outputs or runs in training mode,
when its statistics are not constants, when the Conv's output has another
reader (or is a graph output), or when the Conv's weight or bias is not a
constant. A Mul or Add that does not fit (a residual Add, a broadcast that
is not per channel) is simply not a match: it is no batch norm.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from onnxep.providers.fusions.graph_edits import (
    drop_unread_initializers,
    new_initializer,
    take_over,
)
from onnxep.providers.fusions.naming import Names, graphs
from onnxep.providers.fusions.reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT, label

from .base import RewritePass

TRAINING_OUTPUTS = "the BatchNormalization has training outputs (running mean and variance)"
TRAINING_MODE = "the BatchNormalization runs in training mode"
NOT_SPATIAL = "the BatchNormalization has spatial=0 (statistics per element, not per channel)"
STATS_NOT_CONSTANT = "the BatchNormalization's scale, bias, mean or variance is not a constant"
WEIGHT_NOT_CONSTANT = "the Conv's weight or bias is not a constant"
NOT_PER_CHANNEL = "the BatchNormalization's parameters are not one value per output channel"
NOT_FLOAT = "the Conv's weight is not a floating-point tensor"


def _default(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _const(v: ir.Value | None) -> np.ndarray | None:
    if v is None or v.const_value is None or v.is_graph_input():
        return None
    return v.const_value.numpy()


class FoldBatchNorm(RewritePass):
    """Conv followed by BatchNormalization (or per-channel Mul/Add by constants) -> one Conv.

    ``count`` is how many nodes were folded away; ``refusals`` maps each reason to the
    BatchNormalization nodes refused for it (read by the placement report).
    """

    name = "fold_batch_norm"

    def __init__(self) -> None:
        super().__init__()
        self._refused: dict[tuple[int, str], tuple[ir.Node, str]] = {}

    @property
    def refusals(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node, reason in self._refused.values():
            out.setdefault(reason, []).append(label(node))
        return out

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = Names(model.graph)
        changed = False
        for graph in list(graphs(model.graph)):
            for node in list(graph):
                if node.op_type == "Conv" and _default(node) and node.graph is graph:
                    while self._absorb_next(graph, node, names):
                        changed = True
        return ir.passes.PassResult(model, changed)

    def _refuse(self, node: ir.Node, reason: str) -> bool:
        self._refused.setdefault((id(node), reason), (node, reason))
        return False

    def _absorb_next(self, graph: ir.Graph, conv: ir.Node, names: Names) -> bool:
        """Fold the one reader of ``conv``'s output into it, if it is a match."""
        y = conv.outputs[0]
        uses = y.uses()
        bns = [u.node for u in uses if u.node.op_type == "BatchNormalization" and u.idx == 0]
        if bns and _default(bns[0]):
            bn = bns[0]
            if len(uses) > 1:
                return self._refuse(bn, ANOTHER_CONSUMER)
            if y.is_graph_output():
                return self._refuse(bn, GRAPH_OUTPUT)
            return self._fold_bn(graph, conv, bn, names)
        if len(uses) != 1 or y.is_graph_output():
            return False
        node = uses[0].node
        if node.op_type in ("Mul", "Add") and _default(node) and len(node.inputs) == 2:
            return self._fold_affine(graph, conv, node, uses[0].idx, names)
        return False

    def _weights(self, conv: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
        """The Conv's weight and bias (zeros when it has none), or None when not constant."""
        w = _const(conv.inputs[1]) if len(conv.inputs) > 1 else None
        if w is None or w.ndim < 3:
            return None
        has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
        b = _const(conv.inputs[2]) if has_bias else np.zeros(w.shape[0], w.dtype)
        if b is None or b.shape != (w.shape[0],):
            return None
        return w, b

    def _fold_bn(self, graph: ir.Graph, conv: ir.Node, bn: ir.Node, names: Names) -> bool:
        if any(v.name or v.uses() or v.is_graph_output() for v in bn.outputs[1:]):
            return self._refuse(bn, TRAINING_OUTPUTS)
        attrs = bn.attributes
        if attrs.get("training_mode") is not None and attrs["training_mode"].value:
            return self._refuse(bn, TRAINING_MODE)
        if attrs.get("spatial") is not None and not attrs["spatial"].value:
            return self._refuse(bn, NOT_SPATIAL)
        stats = [_const(v) for v in bn.inputs[1:5]]
        if len(stats) != 4 or any(s is None for s in stats):
            return self._refuse(bn, STATS_NOT_CONSTANT)
        wb = self._weights(conv)
        if wb is None:
            return self._refuse(bn, WEIGHT_NOT_CONSTANT)
        w, b = wb
        if w.dtype.kind != "f" and "float" not in str(w.dtype):
            return self._refuse(bn, NOT_FLOAT)
        channels = w.shape[0]
        if any(s.size not in (1, channels) or s.ndim > 1 for s in stats):
            return self._refuse(bn, NOT_PER_CHANNEL)
        eps = attrs["epsilon"].value if attrs.get("epsilon") is not None else 1e-5
        scale, bias, mean, var = (np.broadcast_to(s.astype(np.float64), channels) for s in stats)
        s = scale / np.sqrt(var + float(eps))
        self._replace_weights(graph, conv, w, b, s, (b.astype(np.float64) - mean) * s + bias, names)
        self._take_output(graph, conv, bn)
        self._refused = {k: r for k, r in self._refused.items() if k[0] != id(bn)}
        return True

    def _fold_affine(
        self, graph: ir.Graph, conv: ir.Node, node: ir.Node, idx: int, names: Names
    ) -> bool:
        c = _const(node.inputs[1 - idx])
        wb = self._weights(conv)
        if c is None or wb is None:
            return False
        w, b = wb
        per_channel = _per_channel(c, w.ndim, w.shape[0])
        if per_channel is None or c.dtype != w.dtype:
            return False
        b64 = b.astype(np.float64)
        if node.op_type == "Mul":
            self._replace_weights(graph, conv, w, b, per_channel, b64 * per_channel, names)
        else:
            self._replace_weights(graph, conv, w, b, None, b64 + per_channel, names)
        self._take_output(graph, conv, node)
        return True

    def _replace_weights(
        self,
        graph: ir.Graph,
        conv: ir.Node,
        w: np.ndarray,
        b: np.ndarray,
        scale: np.ndarray | None,
        bias64: np.ndarray,
        names: Names,
    ) -> None:
        old = list(conv.inputs[1:])
        stem = conv.name or "Conv"
        if scale is not None:
            shape = (w.shape[0],) + (1,) * (w.ndim - 1)
            w_new = (w.astype(np.float64) * scale.reshape(shape)).astype(w.dtype)
            conv.replace_input_with(
                1, new_initializer(graph, names.fresh(f"{stem}/W_folded"), w_new)
            )
        b_value = new_initializer(graph, names.fresh(f"{stem}/B_folded"), bias64.astype(w.dtype))
        if len(conv.inputs) < 3:
            conv.resize_inputs(3)
        conv.replace_input_with(2, b_value)
        drop_unread_initializers(old)

    def _take_output(self, graph: ir.Graph, conv: ir.Node, node: ir.Node) -> None:
        """``conv``'s output becomes ``node``'s (its name, its readers); ``node`` goes."""
        out = node.outputs[0]
        take_over(out, conv.outputs[0])
        others = [v for v in node.inputs if v is not None and v is not conv.outputs[0]]
        graph.remove(node, safe=True)
        drop_unread_initializers(others)
        self.count += 1


def _per_channel(c: np.ndarray, rank: int, channels: int) -> Any:
    """``c`` as one float64 value per output channel of a rank-``rank`` Conv output, or None
    when broadcasting it would not act per channel (or would change the output's shape)."""
    if c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if shape[0] != 1 or any(d != 1 for d in shape[2:]) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c.astype(np.float64).reshape(-1), channels).copy()
