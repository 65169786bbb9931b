"""The node a fused "RMS norm, then a GEMV" op stands for, split back into its two parts.

``fuse_norm_matmul`` folds a SimplifiedLayerNormalization or a
SkipSimplifiedLayerNormalization into the MatMulNT or MatMulNBits that reads its output.
The fused node's inputs are the norm's, in SkipSimplifiedLayerNormalization's order
``(x, skip, gamma, norm_bias)`` (skip and norm_bias omitted for a plain RMS norm), then
the GEMV's inputs after A; its outputs are the GEMV's output and, when the graph reads it,
the norm's residual sum ``x + skip (+ norm_bias)``. Attribute ``epsilon`` is the norm's;
the GEMV's attributes follow. :func:`norm_node` and :func:`gemv_node` rebuild the two nodes
as the session saw them, so every provider runs a fused node with the builders of the
nodes it replaced wherever its own one-launch kernel does not take it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnxep.errors import InvalidModel
from onnxep.providers.node import NodeInfo, ValueInfo

#: Inputs of the norm part: x, skip, gamma, norm_bias.
NORM_INPUTS = 4
#: The norm's attribute; the rest are the GEMV's.
NORM_ATTRS = ("epsilon",)
MS = "com.microsoft"


def _where(node: NodeInfo) -> str:
    return f"{node.domain}::{node.op_type} node {node.name!r}"


def has_skip(node: NodeInfo) -> bool:
    return node.has_input(1)


def epsilon(node: NodeInfo) -> float:
    if "epsilon" not in node.attrs:
        raise InvalidModel(f"{_where(node)}: attribute 'epsilon' (the norm's) is required")
    return float(node.attrs["epsilon"])


def _normalised(node: NodeInfo) -> ValueInfo:
    x = node.inputs[0]
    shape = None if x is None else x.shape
    return ValueInfo(f"{node.name}/normalised", "tensor", None if x is None else x.dtype, shape)


def norm_node(node: NodeInfo) -> NodeInfo:
    """The norm the fused node replaced: SkipSimplifiedLayerNormalization (with a skip: outputs
    0 and, when the fused node has it, 3, the sum) or SimplifiedLayerNormalization over the
    last axis with float32 statistics."""
    if node.num_inputs < NORM_INPUTS + 1 or not node.has_input(0) or not node.has_input(2):
        raise InvalidModel(
            f"{_where(node)}: inputs are (x, skip, gamma, norm_bias, <the GEMV's inputs after "
            f"A>); x and gamma are required"
        )
    eps = epsilon(node)
    y = _normalised(node)
    want_sum = node.has_output(1)
    if has_skip(node):
        ins = node.inputs[:NORM_INPUTS]
        outs = (y, None, None, node.outputs[1] if want_sum else None)
        return NodeInfo("SkipSimplifiedLayerNormalization", MS, node.name, 1, {"epsilon": eps},
                        ins, outs, opsets=node.opsets)  # fmt: skip
    if node.has_input(3) or want_sum:
        raise InvalidModel(
            f"{_where(node)}: without a skip input there is no norm bias and no residual sum"
        )
    attrs = {"axis": -1, "epsilon": eps, "stash_type": 1}
    return NodeInfo("SimplifiedLayerNormalization", "", node.name, 1, attrs,
                    (node.inputs[0], node.inputs[2]), (y,), opsets=node.opsets)  # fmt: skip


def gemv_node(node: NodeInfo, op_type: str, domain: str) -> NodeInfo:
    """The GEMV the fused node replaced: ``op_type`` reading the normalised rows as A."""
    attrs = {k: v for k, v in node.attrs.items() if k not in NORM_ATTRS}
    ins = (_normalised(node), *node.inputs[NORM_INPUTS:])
    return NodeInfo(op_type, domain, node.name, node.opset, attrs, ins, node.outputs[:1],
                    opsets=node.opsets)  # fmt: skip


def split_runner(node: NodeInfo, norm: Callable, gemv: Callable) -> Callable:
    """``run(x, skip, gamma, norm_bias, *gemv_inputs) -> (y[, sum])`` from the two parts'
    runners: the norm, then the GEMV on its output."""
    skip = has_skip(node)
    width = max(node.num_outputs, 1)

    def run(x: Any, sk: Any, gamma: Any, nbias: Any, *rest: Any) -> tuple:
        if skip:
            outs = norm(x, sk, gamma) if nbias is None else norm(x, sk, gamma, nbias)
            h, total = outs[0], outs[3] if len(outs) > 3 else None
        else:
            h, total = norm(x, gamma)[0], None
        (y,) = gemv(h, *rest)[:1]
        return (y, total)[:width]

    return run
