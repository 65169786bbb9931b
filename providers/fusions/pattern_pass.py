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

import threading
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern

from .naming import Names, graphs
from .reporting import (
    ANOTHER_CONSUMER,
    GRAPH_OUTPUT,
    READ_TOO_EARLY,
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


def _op_of(node_pattern: Any) -> tuple[str, str] | None:
    ident = node_pattern.op_identifier()
    if ident is None:  # commuted copies carry the op as a constant pattern instead
        ident = (node_pattern.domain.value(), node_pattern.op.value())
    if not isinstance(ident[0], str) or not isinstance(ident[1], str):
        return None
    return _domain(ident[0]), ident[1]


class _Signature:
    """The anchor's (domain, op) and the ops producing its inputs, as a rule's pattern has them.

    A cheap test that skips nodes the rule cannot match before onnxscript's
    matcher is asked (most candidate nodes fail here). Read from the compiled
    pattern, which onnxscript does not document; when it is not there the test
    passes everything (slower, same result).
    """

    def __init__(self, rule: pattern.RewriteRule) -> None:
        self.op: tuple[str, str] | None = None
        self.producers: list[tuple[int, tuple[str, str]]] = []
        try:
            # onnxscript keeps the compiled pattern private; guarded: without it, no shortcut
            root = rule._target_pattern.output_nodes[0]  # noqa: SLF001
            self.op = _op_of(root)
            for i, v in enumerate(root.inputs):
                producer = getattr(v, "producer", None)
                node_pattern = producer() if callable(producer) else None
                if node_pattern is not None and (op := _op_of(node_pattern)) is not None:
                    self.producers.append((i, op))
        except (AttributeError, IndexError, TypeError):
            self.op, self.producers = None, []

    def admits(self, node: ir.Node, key: tuple[str, str]) -> bool:
        if self.op is not None and self.op != key:
            return False
        inputs = node.inputs
        for i, op in self.producers:
            v = inputs[i] if i < len(inputs) else None
            p = None if v is None else v.producer()
            if p is None or (_domain(p.domain), p.op_type) != op:
                return False
        return True


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


_local = threading.local()


def _thread_rules(p: PatternFusionPass) -> list[tuple[pattern.RewriteRule, _Signature]]:
    """A pass class's rules, compiled once per thread.

    Compiling a rule set (every commuted variant) costs more than matching it
    on a small model, so sessions reuse it; per thread, because onnxscript's
    matchers and some rules (``RmsNormFusion``) keep state from match to rewrite,
    and sessions may be created on several threads at once. A pass whose rules depend
    on its arguments says so in ``rules_key``.
    """
    cache = getattr(_local, "rules", None)
    if cache is None:
        cache = _local.rules = {}
    key = (type(p), p.rules_key)
    if key not in cache:
        cache[key] = [(r, _Signature(r)) for r in p.make_rules()]
    return cache[key]


class PatternFusionPass(ReportingFusionPass):
    """Apply onnxscript rewrite rules, restricted to the bound provider's nodes and kernels.

    Subclasses set ``name`` (the switch) and return their rules from
    :meth:`make_rules`; a rule set may also be passed in directly. A subclass whose
    rules depend on its constructor's arguments sets ``rules_key`` from them before
    calling ``__init__`` (compiled rules are shared per class and key).
    """

    rules_key: tuple = ()

    def __init__(self, rules: Sequence[pattern.RewriteRule] | None = None) -> None:
        super().__init__()
        if rules is not None:
            self.rules = [(r, _Signature(r)) for r in rules]
        else:
            self.rules = _thread_rules(self)
        anywhere = [rs for rs in self.rules if rs[1].op is None]
        self._by_op: dict[tuple[str, str], list] = {}
        for rs in self.rules:
            if rs[1].op is not None:
                self._by_op.setdefault(rs[1].op, list(anywhere)).append(rs)
        self._anywhere = anywhere
        self._tracer = _LastStatus()
        self._names: Names | None = None

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        raise NotImplementedError(f"{type(self).__name__} gives no rules")

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._names = None  # gathered at the first fire
        changed = False
        for graph in list(graphs(model.graph)):
            changed |= self._graph(model, graph)
        return ir.passes.PassResult(model, changed)

    def _graph(self, model: ir.Model, graph: ir.Graph) -> bool:
        changed = False
        positions: dict[int, int] = {}  # each node's position in graph, counted when needed
        for node in list(graph):
            if node.graph is not graph:
                continue  # removed by an earlier match in this sweep
            key = (_domain(node.domain), node.op_type)
            for rule, signature in self._by_op.get(key, self._anywhere):
                if not signature.admits(node, key):
                    continue
                if self._try(model, graph, node, rule, positions):
                    changed = True
                    positions.clear()  # nodes moved: recount when next needed
                    break
        return changed

    def _try(
        self,
        model: ir.Model,
        graph: ir.Graph,
        node: ir.Node,
        rule: pattern.RewriteRule,
        positions: dict[int, int],
    ) -> bool:
        """Match ``rule`` at ``node`` and rewrite it, or record why not; whether it fired."""
        match = self._match(model, graph, node, rule)
        if match is None:
            return False
        nodes = list(match.nodes)
        why = escape(nodes, match.outputs)
        last = _last(nodes, match.outputs, graph, positions) if why is None else None
        if why is None and last is None:
            why = READ_TOO_EARLY
        if why is not None:
            self.refuse(node, why)
            return False
        return self._rewrite(model, graph, node, rule, last)

    def _match(
        self, model: ir.Model, graph: ir.Graph, node: ir.Node, rule: pattern.RewriteRule
    ) -> Any:
        """The structural match of ``rule`` at ``node`` (its check passed, every node owned),
        else None, with a refusal recorded where the structure matched."""
        tracer = self._tracer
        tracer.reset()
        try:
            match = rule.match(model, graph, node, check_nodes_are_removable=False, tracer=tracer)
        except Exception as exc:  # a rule's check that crashes refuses this match, not the pass
            self.refuse(node, f"rule {rule.name} raised {type(exc).__name__}: {exc}")
            return None
        if not match:
            if tracer.status == _CONDITION_FAILED and tracer.result is not None:
                if self.owns_all(tracer.result.nodes, node):
                    self.refuse(node, tracer.result.reason or f"{rule.name}: check failed")
            return None
        return match if self.owns_all(match.nodes, node) else None

    def _rewrite(
        self,
        model: ir.Model,
        graph: ir.Graph,
        node: ir.Node,
        rule: pattern.RewriteRule,
        last: ir.Node,
    ) -> bool:
        """Build the replacement and put it in after ``last``, unless the provider cannot run it."""
        imports = (dict(graph.opset_imports), dict(model.graph.opset_imports))
        why = None
        try:
            delta = rule.try_rewrite(model, graph, node)
        except ValueError as exc:  # the replacement's opset clashes with the model's imports
            delta, why = None, f"{rule.name}: {exc}"
        if delta is not None:
            missing = [
                n for n in delta.new_nodes if not self.can_emit(_domain(n.domain), n.op_type)
            ]
            taken = [v.name for v in delta.new_initializers if v.name in graph.initializers]
            if missing:
                why = no_kernel(missing[0].domain, missing[0].op_type)
            elif taken:
                why = f"{rule.name}: a new constant's name {taken[0]!r} is taken"
        if delta is None or why is not None:
            _restore_imports(graph, model, imports)
            if why is not None:
                self.refuse(node, why)
            return False
        for init in delta.new_initializers:
            graph.register_initializer(init)
        ir.convenience.replace_nodes_and_values(
            graph, last, delta.match.nodes, delta.new_nodes, delta.match.outputs, delta.new_outputs
        )
        if self._names is None:
            self._names = Names(model.graph)
        self._names.name_new_nodes(list(delta.new_nodes), last.name or last.op_type)
        self.fire(node, rule.name or type(rule).__name__)
        return True


def _last(
    nodes: Sequence[ir.Node], outputs: Sequence[ir.Value], graph: ir.Graph, positions: dict
) -> ir.Node | None:
    """The matched node after which the replacement can go, or None when there is none: a
    replaced output is read, outside the match, before the match's last node.

    In a graph in order, a match with one sink (a node whose outputs no other matched node
    reads) ends at that sink, and whatever reads the sink's outputs comes after it; node
    positions are counted only for the other cases (a skip norm's sum comes from its Add).
    """
    inside = {id(n) for n in nodes}
    sinks = [n for n in nodes if not any(id(u.node) in inside for v in n.outputs for u in v.uses())]
    if len(sinks) == 1 and all(v.producer() is sinks[0] for v in outputs):
        return sinks[0]
    if not positions:
        positions.update((id(n), i) for i, n in enumerate(graph))
    last = max(nodes, key=lambda n: positions.get(id(n), -1))
    end = positions.get(id(last), -1)
    for v in outputs:
        for use in v.uses():
            if id(use.node) not in inside and positions.get(id(use.node), end + 1) <= end:
                return None
    return last


def _restore_imports(graph: ir.Graph, model: ir.Model, imports: tuple[dict, dict]) -> None:
    """Undo the opset imports ``try_rewrite`` added for a replacement that was not used."""
    for target, saved in (
        (graph.opset_imports, imports[0]),
        (model.graph.opset_imports, imports[1]),
    ):
        for key in [k for k in target if k not in saved]:
            del target[key]
