"""Holding fusion passes to their contract, and undoing a pass that breaks it.

A :class:`~onnxep.providers.rewrite.FusionPass` runs for one provider and may
only remove or change nodes that provider owns, and only emit nodes that
provider has a kernel for at the model's opset. :class:`GraphState` records
what a pass could touch (every graph's nodes, inputs, outputs and
initializers; every node's op, attributes and wiring; every value's name,
type, shape and constant) in O(nodes), so the manager can compare before and
after and, when the contract is broken, put everything back.

Removed nodes lose their inputs, so ownership is asked afterwards of a
stand-in: a detached node with the removed (or changed) node's op, domain,
attributes and inputs as they were, dropped again at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import onnx_ir as ir

from ..errors import InvalidGraph


class _NodeState(NamedTuple):
    graph: Any
    op_type: str
    domain: str
    overload: str
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    attributes: tuple[tuple[str, Any, Any], ...]


class _GraphState(NamedTuple):
    graph: ir.Graph
    nodes: tuple[ir.Node, ...]
    inputs: tuple[ir.Value, ...]
    outputs: tuple[ir.Value, ...]
    initializers: tuple[tuple[str, ir.Value], ...]


class _ValueState(NamedTuple):
    name: str | None
    type: Any
    shape: Any
    const_value: Any


_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.value
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.value


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class GraphState:
    """What a model's graphs look like now, by object identity."""

    def __init__(self, model: ir.Model) -> None:
        self.graphs: list[_GraphState] = []
        self.nodes: dict[int, tuple[ir.Node, _NodeState]] = {}
        self.values: dict[int, tuple[ir.Value, _ValueState]] = {}
        self._capture(model.graph)

    def _value(self, v: ir.Value | None) -> None:
        if v is not None and id(v) not in self.values:
            self.values[id(v)] = (v, _ValueState(v.name, v.type, v.shape, v.const_value))

    def _capture(self, graph: ir.Graph) -> None:
        nodes = tuple(graph)
        self.graphs.append(
            _GraphState(
                graph,
                nodes,
                tuple(graph.inputs),
                tuple(graph.outputs),
                tuple(graph.initializers.items()),
            )
        )
        for v in (*graph.inputs, *graph.initializers.values()):
            self._value(v)
        values = self.values
        for node in nodes:
            attrs = tuple((k, a, a.value) for k, a in node.attributes.items())
            outputs = tuple(node.outputs)
            self.nodes[id(node)] = (
                node,
                _NodeState(
                    node.graph,
                    node.op_type,
                    node.domain,
                    node.overload,
                    tuple(node.inputs),
                    outputs,
                    attrs,
                ),
            )
            for v in outputs:
                values[id(v)] = (v, _ValueState(v.name, v.type, v.shape, v.const_value))
            for _, a, _ in attrs:
                if a.type in _GRAPH_ATTRS:
                    for sub in _subgraphs(node):
                        self._capture(sub)
                    break

    def same_as(self, other: GraphState) -> bool:
        """Whether ``other`` has the same graphs, nodes and values, field by field."""
        if len(self.graphs) != len(other.graphs) or self.nodes.keys() != other.nodes.keys():
            return False
        for a, b in zip(self.graphs, other.graphs):
            if a.graph is not b.graph or not all(
                _same(x, y)
                for x, y in ((a.nodes, b.nodes), (a.inputs, b.inputs), (a.outputs, b.outputs))
            ):
                return False
            if [(k, id(v)) for k, v in a.initializers] != [(k, id(v)) for k, v in b.initializers]:
                return False
        for key, (_, mine) in self.nodes.items():
            if _node_diff(mine, other.nodes[key][1], removed=set()):
                return False
        for key, (_, mine) in self.values.items():
            theirs = other.values.get(key)
            if theirs is None or not _same_value(mine, theirs[1]):
                return False
        return True

    def restore(self, model: ir.Model) -> None:
        """Put ``model`` back as it was when this state was taken; InvalidGraph if it cannot be."""
        try:
            self._restore()
        except Exception as exc:
            raise InvalidGraph(f"a rewrite could not be rolled back: {exc}") from exc
        if not self.same_as(GraphState(model)):
            raise InvalidGraph("a rewrite could not be rolled back: the graph still differs")

    def _restore(self) -> None:
        # Graph inputs, outputs and initializers are let go first: an
        # initializer's name cannot change while it is one.
        for gs in self.graphs:
            gs.graph.initializers.clear()
            gs.graph.inputs.clear()
            gs.graph.outputs.clear()
        for v, s in self.values.values():
            v.name, v.type, v.shape, v.const_value = s.name, s.type, s.shape, s.const_value
        for gs in self.graphs:
            g = gs.graph
            current = list(g)
            for node in current:
                if id(node) not in self.nodes:
                    _detach(node)
            g.remove(current)
            for node in gs.nodes:
                g.append(node)
            g.inputs.extend(gs.inputs)
            g.outputs.extend(gs.outputs)
            for name, v in gs.initializers:
                g.initializers[name] = v
        for node, s in self.nodes.values():
            node.op_type, node.domain, node.overload = s.op_type, s.domain, s.overload
            node.attributes.clear()
            for k, a, _ in s.attributes:
                node.attributes[k] = a
            if len(node.inputs) != len(s.inputs):
                node.resize_inputs(len(s.inputs))
            for i, v in enumerate(s.inputs):
                if node.inputs[i] is not v:
                    node.replace_input_with(i, v)


def _detach(node: ir.Node) -> None:
    """Drop a node the pass created from its inputs' uses (and its subgraphs' nodes)."""
    for sub in _subgraphs(node):
        for inner in sub:
            _detach(inner)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)


def _same_value(a: _ValueState, b: _ValueState) -> bool:
    return (
        a.name == b.name
        and a.type is b.type
        and a.shape is b.shape
        and a.const_value is b.const_value
    )


def _node_diff(before: _NodeState, after: _NodeState, removed: set[int]) -> str:
    """What changed in a node that survived, or ''.

    An input rewired away from a node the pass removed is not a change: that
    is how a fused node's output replaces the last removed node's.
    """
    if (before.op_type, before.domain, before.overload) != (
        after.op_type,
        after.domain,
        after.overload,
    ):
        return f"its op became {after.domain or 'ai.onnx'}::{after.op_type}"
    if before.graph is not after.graph:
        return "it moved to another graph"
    if not _same(before.outputs, after.outputs):
        return "its outputs changed"
    if [(k, id(a), id(v)) for k, a, v in before.attributes] != [
        (k, id(a), id(v)) for k, a, v in after.attributes
    ]:
        return "its attributes changed"
    if len(before.inputs) != len(after.inputs):
        return "its inputs changed"
    for i, (old, new) in enumerate(zip(before.inputs, after.inputs)):
        if old is new:
            continue
        producer = None if old is None else old.producer()
        if producer is None or id(producer) not in removed:
            return f"its input {i} was rewired"
    return ""


def _describe(node: ir.Node) -> str:
    dom = node.domain or "ai.onnx"
    return f"{node.name or '<unnamed>'!r} ({dom}::{node.op_type})"


def _owned_before(s: _NodeState, owns: Callable[[ir.Node], bool]) -> bool:
    """``owns`` of a node as it was: asked of a detached stand-in, dropped at once."""
    attrs = [a for _, a, _ in s.attributes]
    stand_in = ir.Node(s.domain, s.op_type, s.inputs, attrs, num_outputs=len(s.outputs))
    try:
        return bool(owns(stand_in))
    finally:
        for i in range(len(stand_in.inputs)):
            stand_in.replace_input_with(i, None)


def contract_problems(
    before: GraphState,
    after: GraphState,
    owns: Callable[[ir.Node], bool],
    provider: str,
    has_kernel: Callable[[ir.Node], bool],
) -> list[str]:
    """How a fusion pass for ``provider`` broke its contract going from ``before`` to ``after``.

    ``owns`` says whether ``provider`` owns a node; it is asked only about
    the nodes the pass removed or changed, as they were before it.
    """
    removed = {k for k in before.nodes if k not in after.nodes}
    problems: list[str] = []
    for key, (node, s) in before.nodes.items():
        if key in removed:
            if not _owned_before(s, owns):
                problems.append(f"removed node {_describe(node)}, which {provider!r} does not own")
            continue
        what = _node_diff(s, after.nodes[key][1], removed)
        if what and not _owned_before(s, owns):
            problems.append(
                f"changed node {_describe(node)} ({what}), which {provider!r} does not own"
            )
    for key, (node, _) in after.nodes.items():
        if key not in before.nodes and not has_kernel(node):
            problems.append(
                f"emitted node {_describe(node)}, for which {provider!r} has no kernel at the "
                "model's opset"
            )
    return problems
