"""The rewrite-pass contract shared by the core and provider plugins.

A pass is an onnx-ir in-place pass (``call(model) -> PassResult``) with a
switch name (plugins.toml ``[rewrites]``) and a counter the placement report
shows. A :class:`FusionPass` runs for one provider (``extended`` level): the
session binds the provider and an ownership test, and the pass must only
rewrite nodes that provider owns into ops that provider has kernels for.
The session checks that after every call (``onnxep.rewrites.contract``): a
pass that removes or changes a node its provider does not own, emits a node
its provider has no kernel for at the model's opset, or raises, is rolled
back, left out of the session and reported in ``onnxep.plugin_failures()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx_ir as ir


class RewritePass(ir.passes.InPlacePass):
    name: str = "rewrite"

    def __init__(self) -> None:
        super().__init__()
        self.count = 0


class FusionPass(RewritePass):
    """A pass that replaces a connected group of one provider's nodes by one fused node."""

    def __init__(self) -> None:
        super().__init__()
        self.provider: Any = None
        self.owns: Callable[[ir.Node], bool] = lambda node: True
        self.opsets: dict[str, int] = {}

    def bind(self, provider: Any, owns: Callable[[ir.Node], bool], opsets: dict[str, int]) -> None:
        self.provider, self.owns, self.opsets = provider, owns, opsets

    def can_emit(self, domain: str, op_type: str) -> bool:
        """Whether the bound provider has a kernel for ``domain::op_type`` at the model's opset."""
        if self.provider is None:
            return False
        domain = "" if domain == "ai.onnx" else domain
        opset = self.opsets.get(domain, self.opsets.get("ai.onnx" if not domain else domain, 1))
        return self.provider.registry.lookup(domain, op_type, opset) is not None


def single_use(v: ir.Value | None, graph_outputs: set[int]) -> bool:
    """``v`` feeds exactly one node input and is not a graph output: safe to fuse away."""
    return v is not None and id(v) not in graph_outputs and len(v.uses()) == 1


def const_array(v: ir.Value | None) -> Any:
    if v is None or v.const_value is None or v.is_graph_input():
        return None
    return v.const_value.numpy()


def only_consumer(v: ir.Value) -> ir.Node | None:
    uses = v.uses()
    return uses[0].node if len(uses) == 1 else None
