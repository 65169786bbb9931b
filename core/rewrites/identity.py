"""Remove Identity nodes by pointing their consumers at the input."""

from __future__ import annotations

import onnx_ir as ir

from .base import RewritePass


class EliminateIdentity(RewritePass):
    name = "eliminate_identity"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = self._graph(model.graph)
        return ir.passes.PassResult(model, changed)

    def _graph(self, graph: ir.Graph) -> bool:
        changed = False
        outputs = {id(v) for v in graph.outputs}
        for node in list(graph):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    changed |= self._graph(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for g in attr.value:
                        changed |= self._graph(g)
            if node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
                continue
            src, dst = node.inputs[0], node.outputs[0]
            if src is None or id(dst) in outputs:
                # A graph output keeps its name, so its Identity stays.
                continue
            dst.replace_all_uses_with(src)
            graph.remove(node, safe=True)
            self.count += 1
            changed = True
        return changed
