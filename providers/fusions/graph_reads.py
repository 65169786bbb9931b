"""Reads the node-walking fusions share: the one reader of a value, and a binary node's other
operand."""

from __future__ import annotations

import onnx_ir as ir


def sole_reader(v: ir.Value) -> ir.Node | None:
    """The one node reading ``v`` (read once and not a graph output, so the node may absorb
    it), else None."""
    uses = v.uses()
    if len(uses) != 1 or v.is_graph_output():
        return None
    return uses[0].node


def other_operand(node: ir.Node, v: ir.Value) -> ir.Value | None:
    """The operand of a two-input node that is not ``v``; None where ``v`` is neither."""
    a, b = node.inputs[0], node.inputs[1]
    if a is v:
        return b
    if b is v:
        return a
    return None
