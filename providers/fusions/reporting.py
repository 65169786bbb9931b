"""What a fusion pass did: how often each rule fired, and which matches it refused and why.

The manager calls a pass once per round until a round changes nothing, so a
refused match is seen again every round. Refusals are therefore kept per
anchor node (the node a match was found from) and reason: seen twice, counted
once; fused in a later round, forgotten. The nodes are held, not their ids, so
an id cannot be reused by a new node while its refusal is on record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import onnx_ir as ir

from ..rewrite import FusionPass

# Refusal reasons shared by the passes, so a report can add them up across passes.
ANOTHER_CONSUMER = "an intermediate has another consumer"
GRAPH_OUTPUT = "an intermediate is a graph output"
SPANS_PROVIDERS = "its nodes span providers"
READ_TOO_EARLY = "an output is read before the match's last node"


def no_kernel(domain: str, op_type: str) -> str:
    return f"no kernel for {domain or 'ai.onnx'}::{op_type}"


def label(node: ir.Node) -> str:
    return node.name or f"<unnamed {node.op_type}>"


class ReportingFusionPass(FusionPass):
    """A fusion pass that counts fires per rule and records refused matches with reasons."""

    #: True when the fused node is byte-identical to the nodes it replaces on the same
    #: provider; False when it is equal within the dtype's tolerance (it rounds less often).
    exact: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.fired: Counter[str] = Counter()
        self.refused: dict[tuple[int, str], tuple[ir.Node, str]] = {}

    def refuse(self, anchor: ir.Node, reason: str) -> None:
        self.refused.setdefault((id(anchor), reason), (anchor, reason))

    def owns_all(self, nodes: Sequence[ir.Node], anchor: ir.Node) -> bool:
        """Whether the provider owns every node; a refusal when it owns only some."""
        owned = [bool(self.owns(n)) for n in nodes]
        if all(owned):
            return True
        if any(owned):
            self.refuse(anchor, SPANS_PROVIDERS)
        return False

    def fire(self, anchor: ir.Node, rule: str) -> None:
        self.count += 1
        self.fired[rule] += 1
        for key in [k for k in self.refused if k[0] == id(anchor)]:
            del self.refused[key]

    @property
    def refusals(self) -> dict[str, list[str]]:
        """Each reason with the refused matches' anchor nodes, in the order first seen."""
        out: dict[str, list[str]] = {}
        for node, reason in self.refused.values():
            out.setdefault(reason, []).append(label(node))
        return out
