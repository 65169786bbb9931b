"""Walking a model's graphs, and fresh names for the values and nodes a fusion creates."""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir


def graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` and every subgraph nested in its nodes' attributes, outermost first."""
    yield graph
    for node in graph:
        if not node.attributes:
            continue
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from graphs(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for g in attr.value:
                    yield from graphs(g)


class Names:
    """Names not yet used by any value, initializer or node of a model's graphs."""

    def __init__(self, graph: ir.Graph) -> None:
        taken: set[str] = set()
        for g in graphs(graph):
            taken.update(v.name for v in g.inputs if v.name)
            taken.update(g.initializers)
            for n in g:
                taken.update(v.name for v in n.outputs if v.name)
                if n.name:
                    taken.add(n.name)
        self._taken = taken

    def add(self, name: str) -> None:
        self._taken.add(name)

    def fresh(self, stem: str) -> str:
        name, k = stem, 0
        while name in self._taken:
            k += 1
            name = f"{stem}_{k}"
        self._taken.add(name)
        return name

    def name_new_nodes(self, nodes: list[ir.Node], stem: str) -> None:
        """Name unnamed nodes, and their outputs that something reads; unread outputs stay
        unnamed, which the session takes as an omitted optional output."""
        for n in nodes:
            if not n.name:
                n.name = self.fresh(f"{stem}/{n.op_type}")
            for v in n.outputs:
                if v.name:
                    self.add(v.name)
                elif v.uses() or v.is_graph_output():
                    v.name = self.fresh(f"{n.name}_out{v.index()}")
