"""An If whose condition is a constant replaced by the nodes of the branch it takes.

Exporters guard reshapes with an If on a shape test (``If(Equal(Gather(Shape(x), 0),
1))``, torch's squeeze of a dim that may not be 1); once the shapes are static
(``InferStaticShapes``) and the test is folded, the If always takes one branch, and
running it as a subgraph costs a sub-executor's call and its feeds on every run.
onnxruntime inlines such an If when it folds constants; so does this pass: the branch's
nodes and initializers move into the enclosing graph in front of the If, and its outputs
take over the If's (names, readers, graph outputs). A branch output that the branch does
not compute (an outer value, an initializer of the branch, or one value given twice) goes
through an Identity, so each If output stays a value of its own.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxep.providers.fusions.naming import Names, graphs

from .base import RewritePass


def _names_in(graph: ir.Graph) -> set[str]:
    taken = {v.name for v in graph.inputs if v.name}
    taken.update(graph.initializers)
    for n in graph:
        taken.update(v.name for v in n.outputs if v.name)
    return taken


class InlineConstantIf(RewritePass):
    """If with a constant condition -> the taken branch's nodes. ``count``: If nodes."""

    name = "inline_constant_if"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names: Names | None = None
        changed = False
        for graph in list(graphs(model.graph)):
            for node in list(graph):
                branch = _taken(node)
                if branch is None:
                    continue
                names = names or Names(model.graph)
                _inline(graph, node, branch, names)
                self.count += 1
                changed = True
        return ir.passes.PassResult(model, changed)


def _taken(node: ir.Node) -> ir.Graph | None:
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    cond = node.inputs[0]
    if cond is None or cond.is_graph_input() or cond.const_value is None:
        return None
    c = cond.const_value.numpy()
    if c.size != 1:
        return None  # the run refuses it, with the node's name
    attr = node.attributes.get("then_branch" if bool(c.reshape(-1)[0]) else "else_branch")
    if attr is None or attr.type != ir.AttributeType.GRAPH:
        return None
    branch = attr.value
    if len(branch.outputs) != len(node.outputs) or branch.inputs:
        return None
    # An output the branch does not compute (an outer value or an initializer given back as
    # it is) is read from the graph it was loaded in under its name only: left to the run.
    if any(
        v is None or v.producer() is None or v.producer().graph is not branch
        for v in branch.outputs
    ):
        return None
    return branch


def _inline(graph: ir.Graph, node: ir.Node, branch: ir.Graph, names: Names) -> None:
    taken = _names_in(graph)
    for name, init in list(branch.initializers.items()):
        del branch.initializers[name]
        if name in taken:
            init.name = names.fresh(name)
        graph.register_initializer(init)
        taken.add(init.name)
    moved = list(branch)
    branch.remove(moved, safe=False)
    for n in moved:
        for v in n.outputs:
            if v.name and v.name in taken:
                v.name = names.fresh(v.name)  # two branches inlined here named alike
            if v.name:
                taken.add(v.name)
    graph.insert_before(node, moved)
    results = list(branch.outputs)
    branch.outputs.clear()
    seen: set[int] = set()
    for old, new in zip(list(node.outputs), results):
        if id(new) in seen:
            ident = ir.Node(
                "",
                "Identity",
                [new],
                name=names.fresh(f"{node.name or 'If'}/Identity"),
                num_outputs=1,
            )
            graph.insert_before(node, ident)
            new = ident.outputs[0]
        seen.add(id(new))
        dtype, shape = new.type or old.type, new.shape or old.shape
        name = old.name
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        old.name = None
        new.name = name
        new.type, new.shape = dtype, shape
    graph.remove(node, safe=True)
