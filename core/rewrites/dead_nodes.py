"""Remove nodes whose outputs nothing reads."""

from __future__ import annotations

import onnx_ir as ir

from .base import RewritePass


class RemoveDeadNodes(RewritePass):
    name = "remove_dead_nodes"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, self._graph(model.graph))

    def _graph(self, graph: ir.Graph) -> bool:
        changed = False
        outputs = {id(v) for v in graph.outputs}
        for node in reversed(list(graph)):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    changed |= self._graph(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for g in attr.value:
                        changed |= self._graph(g)
            if any(id(o) in outputs or o.uses() for o in node.outputs):
                continue
            graph.remove(node, safe=True)
            self.count += 1
            changed = True
        return changed
