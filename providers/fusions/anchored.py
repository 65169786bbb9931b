"""A pass that replaces each match found from one anchor node by one onnxep node.

The unrolled-cell passes (``FuseLSTMCell``, ``FuseGRUCell``) walk every node of every
graph, match a whole cell from it, and swap the cell for one fused node: the walk, the
ownership and kernel checks, the naming and the graph edit are theirs in common; only
the match and the fused node differ.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from ..ops.fused import DOMAIN
from .graph_edits import take_over
from .naming import Names, graphs
from .reporting import ReportingFusionPass, no_kernel


class AnchoredFusionPass(ReportingFusionPass):
    """Subclasses set ``op_type`` (the fused onnxep node) and ``rule`` (the fire's name,
    also the fused node's name suffix) and define :meth:`match` and :meth:`build`.

    A match is a dict with at least ``nodes`` (every node it replaces) and ``at`` (the
    node the fused one goes before)."""

    op_type: str
    rule: str

    def match(self, node: ir.Node) -> dict[str, Any] | None:
        """The match anchored at ``node``, or None."""
        raise NotImplementedError

    def build(self, m: dict[str, Any], name: str) -> tuple[ir.Node, list[ir.Value]]:
        """The fused node named ``name`` for match ``m``, and the values its outputs take
        over, in output order."""
        raise NotImplementedError

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names: Names | None = None
        changed = False
        for graph in list(graphs(model.graph)):
            for node in list(graph):
                if node.graph is not graph:  # removed by an earlier match
                    continue
                m = self.match(node)
                if m is None or not self.owns_all(m["nodes"], node):
                    continue
                if not self.can_emit(DOMAIN, self.op_type):
                    self.refuse(node, no_kernel(DOMAIN, self.op_type))
                    continue
                names = names or Names(model.graph)
                fused, replaced = self.build(
                    m, names.fresh(f"{node.name or node.op_type}/{self.rule}")
                )
                for old, new in zip(replaced, fused.outputs, strict=True):
                    take_over(old, new)
                graph.insert_before(m["at"], [fused])
                graph.remove(m["nodes"], safe=True)
                self.fire(node, self.rule)
                changed = True
        return ir.passes.PassResult(model, changed)
