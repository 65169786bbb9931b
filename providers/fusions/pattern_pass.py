"""A fusion pass driven by onnxscript rewrite rules, held to one provider's nodes and kernels.

onnxscript's rewriter (``onnxscript.rewriter.pattern``) matches on the same
onnx-ir graph the session holds. Its own driver (``RewriteRuleSet.apply_to_model``)
rewrites every match it finds; a provider's pass may only take matches whose
nodes the provider owns and emit ops it has kernels for, and must say why it
refused the others. So this pass drives the rules itself, one anchor node at a
time:

1. ``rule.match(..., check_nodes_are_removable=False)`` finds the structure and
   runs the rule's check; a check that fails is heard through a tracer, and is
   a refusal with the check's reason (a pattern that does not match is not);
2. matches whose nodes the provider does not own are skipped silently when it
   owns none of them (they are another provider's) and refused when it owns
   some (the match spans providers);
3. an intermediate value that is a graph output or has a consumer outside the
   match is a refusal naming which (onnxscript's own removability check says
   only "other uses");
4. ``rule.try_rewrite`` builds the replacement; an op the provider has no
   kernel for at the model's opset is a refusal;
5. the replacement goes in after the match's last node, unless a replaced
   output is read before that node (a refusal: moving other nodes is not this
   pass's business).

Unused optional outputs of the new nodes stay unnamed (the session treats an
unnamed output as omitted); used ones get a fresh name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern

from .naming import Names, graphs
from .reporting import (
    ANOTHER_CONSUMER,
    GRAPH_OUTPUT,
    READ_TOO_EARLY,
    SPANS_PROVIDERS,
    ReportingFusionPass,
    no_kernel,
)

_CONDITION_FAILED = pattern.MatchStatus.CONDITION_FAILED


class _LastStatus(pattern.MatchingTracer):
    """Keeps only the status and result of the latest match attempt."""

    def __init__(self) -> None:
        super().__init__()
        self.status: Any = None
        self.result: Any = None

    def reset(self) -> None:
        self.status = self.result = None

    def log(self, rule: Any, container: Any, node: Any, match_result: Any, status: Any) -> None:
        self.status, self.result = status, match_result


def _domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


def _root_op(rule: pattern.RewriteRule) -> tuple[str, str] | None:
    """The (domain, op) a rule's anchor node must have, to skip hopeless nodes cheaply.

    Read from the compiled pattern, which onnxscript does not document (and whose
    commuted copies carry the op as a constant pattern, not an identifier); when
    it is not there, every node is tried (slower, same result).
    """
    try:
        root = rule._target_pattern.output_nodes[0]
        ident = root.op_identifier()
        if ident is None:
            ident = (root.domain.value(), root.op.value())
    except (AttributeError, IndexError, TypeError):
        return None
    if not isinstance(ident[0], str) or not isinstance(ident[1], str):
        return None
    return _domain(ident[0]), ident[1]


def escape(nodes: Sequence[ir.Node], outputs: Sequence[ir.Value]) -> str | None:
    """Why the values ``nodes`` compute, other than ``outputs``, cannot disappear, or None."""
    inside = {id(n) for n in nodes}
    kept = {id(v) for v in outputs}
    for n in nodes:
        for v in n.outputs:
            if id(v) in kept:
                continue
            if v.is_graph_output():
                return GRAPH_OUTPUT
            if any(id(use.node) not in inside for use in v.uses()):
                return ANOTHER_CONSUMER
    return None


class PatternFusionPass(ReportingFusionPass):
    """Apply onnxscript rewrite rules, restricted to the bound provider's nodes and kernels.

    Subclasses set ``name`` (the switch) and return their rules from
    :meth:`make_rules`; a rule set may also be passed in directly.
    """

    def __init__(self, rules: Sequence[pattern.RewriteRule] | None = None) -> None:
        super().__init__()
        given = list(rules) if rules is not None else list(self.make_rules())
        self.rules = [(r, _root_op(r)) for r in given]
        self._tracer = _LastStatus()
        self._names: Names | None = None

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        raise NotImplementedError(f"{type(self).__name__} gives no rules")

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._names = Names(model.graph)
        changed = False
        for graph in list(graphs(model.graph)):
            changed |= self._graph(model, graph)
        return ir.passes.PassResult(model, changed)

    def _graph(self, model: ir.Model, graph: ir.Graph) -> bool:
        changed = False
        order: dict[int, int] | None = None
        for node in list(graph):
            if node.graph is not graph:
                continue  # removed by an earlier match in this sweep
            key = (_domain(node.domain), node.op_type)
            for rule, root in self.rules:
                if root is not None and root != key:
                    continue
                if order is None:
                    order = {id(n): i for i, n in enumerate(graph)}
                if self._try(model, graph, node, rule, order):
                    changed = True
                    order = None  # positions moved
                    break
        return changed

    def _try(
        self,
        model: ir.Model,
        graph: ir.Graph,
        node: ir.Node,
        rule: pattern.RewriteRule,
        order: dict[int, int],
    ) -> bool:
        tracer = self._tracer
        tracer.reset()
        try:
            match = rule.match(model, graph, node, check_nodes_are_removable=False, tracer=tracer)
        except Exception as exc:  # a rule's check that crashes refuses this match, not the pass
            self.refuse(node, f"rule {rule.name} raised {type(exc).__name__}: {exc}")
            return False
        if not match:
            if tracer.status == _CONDITION_FAILED and tracer.result is not None:
                if self._owned(tracer.result.nodes, node):
                    self.refuse(node, tracer.result.reason or f"{rule.name}: check failed")
            return False
        nodes = list(match.nodes)
        if not self._owned(nodes, node):
            return False
        why = escape(nodes, match.outputs)
        if why is not None:
            self.refuse(node, why)
            return False
        last = max(nodes, key=lambda n: order.get(id(n), -1))
        if _read_before(match.outputs, nodes, order, order.get(id(last), -1)):
            self.refuse(node, READ_TOO_EARLY)
            return False
        imports = (dict(graph.opset_imports), dict(model.graph.opset_imports))
        try:
            delta = rule.try_rewrite(model, graph, node)
        except ValueError as exc:  # the replacement's opset clashes with the model's imports
            delta = None
            self.refuse(node, f"{rule.name}: {exc}")
        if delta is None:
            _restore_imports(graph, model, imports)
            return False
        for new in delta.new_nodes:
            if not self.can_emit(_domain(new.domain), new.op_type):
                _restore_imports(graph, model, imports)
                self.refuse(node, no_kernel(new.domain, new.op_type))
                return False
        for init in delta.new_initializers:
            if init.name in graph.initializers:
                _restore_imports(graph, model, imports)
                return False
        for init in delta.new_initializers:
            graph.register_initializer(init)
        ir.convenience.replace_nodes_and_values(
            graph, last, delta.match.nodes, delta.new_nodes, delta.match.outputs, delta.new_outputs
        )
        self._names.name_new_nodes(list(delta.new_nodes), last.name or last.op_type)
        self.fire(node, rule.name or type(rule).__name__)
        return True

    def _owned(self, nodes: Sequence[ir.Node], anchor: ir.Node) -> bool:
        """Whether the provider owns every node; a refusal when it owns only some."""
        owned = [bool(self.owns(n)) for n in nodes]
        if all(owned):
            return True
        if any(owned):
            self.refuse(anchor, SPANS_PROVIDERS)
        return False


def _read_before(
    outputs: Sequence[ir.Value], nodes: Sequence[ir.Node], order: dict[int, int], last: int
) -> bool:
    """Whether a node outside the match reads one of its outputs before position ``last``."""
    inside = {id(n) for n in nodes}
    for v in outputs:
        for use in v.uses():
            if id(use.node) not in inside and order.get(id(use.node), last + 1) <= last:
                return True
    return False


def _restore_imports(graph: ir.Graph, model: ir.Model, imports: tuple[dict, dict]) -> None:
    """Undo the opset imports ``try_rewrite`` added for a replacement that was not used."""
    for target, saved in (
        (graph.opset_imports, imports[0]),
        (model.graph.opset_imports, imports[1]),
    ):
        for key in [k for k in target if k not in saved]:
            del target[key]
