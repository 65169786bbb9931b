"""Giving each node to the first provider that claims it.

After the claims, shape computations that only feed host-memory inputs
(Reshape's shape, Slice's starts, TopK's k) move to the CPU provider, so no
step has to read device memory back to size a tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from onnxep.providers.node import NodeInfo
from onnxep.providers.provider import Claim, Provider

from ..errors import FallbackError, NotImplementedOp
from .nodeinfo import implicit_inputs, make_node_info

COMPUTE = "compute"
HOST_SHAPE = "host-shape"


@dataclass
class PlacedNode:
    """A node, the provider that runs it, and every earlier provider's reason for declining."""

    node: ir.Node
    name: str
    info: NodeInfo
    provider: Provider
    claim: Claim
    declined: list[tuple[str, str]] = field(default_factory=list)
    role: str = COMPUTE
    implicit: list[ir.Value] = field(default_factory=list)


def node_name(node: ir.Node, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def partition(
    graph: ir.Graph,
    providers: Sequence[Provider],
    opsets: dict[str, int],
    compile_subgraph: Callable[[ir.Graph, list[ir.Value]], Any],
    const: Callable[[ir.Value], Any],
    prefix: str = "",
) -> list[PlacedNode]:
    placed: list[PlacedNode] = []
    for index, node in enumerate(graph):
        name = prefix + node_name(node, index)
        info = make_node_info(node, name, opsets, compile_subgraph, const)
        declined: list[tuple[str, str]] = []
        for provider in providers:
            res = provider.claim(info)
            if isinstance(res, Claim):
                placed.append(
                    PlacedNode(
                        node, name, info, provider, res, declined, COMPUTE, implicit_inputs(node)
                    )
                )
                break
            declined.append((provider.name, res.reason))
        else:
            raise NotImplementedOp(_nobody_message(info, declined))
    return placed


def _nobody_message(info: NodeInfo, declined: list[tuple[str, str]]) -> str:
    lines = [f"no provider can run {info.describe()}:"]
    lines += [f"  - {p}: {reason}" for p, reason in declined]
    if not declined:
        lines.append("  (the session has no providers)")
    return "\n".join(lines)


def move_shape_math_to_host(
    placed: list[PlacedNode], host: Provider | None, graph_outputs: Sequence[ir.Value]
) -> int:
    """Re-place on ``host`` the device nodes whose results only size tensors.

    A node moves when every use of its outputs is a host-memory input of a
    device kernel, or an input of a node that moves too, and every input it
    reads is already on the host (a constant, a graph input, a host output).
    A node that computes from shapes alone (constants and host outputs, no
    graph input) moves too when *some* use is such a host input, even if a
    device kernel also reads the result: copying a small value up costs no
    synchronization, reading it back down does. Returns how many nodes moved.
    """
    if host is None:
        return 0
    by_node = {id(p.node): p for p in placed}
    outputs = {id(v) for v in graph_outputs}
    on_host: set[int] = set()

    def host_value(v: ir.Value | None) -> bool:
        if v is None or v.const_value is not None or v.is_graph_input():
            return True
        prod = v.producer()
        p = by_node.get(id(prod)) if prod is not None else None
        if p is None:
            return False
        if p.provider.device == "cpu" or id(p.node) in on_host:
            return True
        return v.index() in p.claim.spec.host_outputs

    # Nodes whose results only ever size tensors: every use is a host-memory
    # input, or an input of another such node. Found by a fixpoint from the end.
    shape_only: set[int] = set()

    def host_use(v: ir.Value) -> bool:
        if id(v) in outputs:
            return False
        for use in v.uses():
            p = by_node.get(id(use.node))
            if p is None:
                return False
            if id(p.node) in shape_only:
                continue
            if use.idx not in p.claim.spec.host_inputs:
                return False
        return True

    grew = True
    while grew:
        grew = False
        for p in reversed(placed):
            if id(p.node) in shape_only or not p.node.outputs:
                continue
            if all(host_use(o) for o in p.node.outputs):
                shape_only.add(id(p.node))
                grew = True

    # Nodes some of whose results size tensors (directly, or through such nodes).
    feeds_host: set[int] = set()

    def some_host_use(v: ir.Value) -> bool:
        for use in v.uses():
            p = by_node.get(id(use.node))
            if p is None:
                continue
            key = id(p.node)
            if key in shape_only or key in feeds_host or use.idx in p.claim.spec.host_inputs:
                return True
        return False

    grew = True
    while grew:
        grew = False
        for p in reversed(placed):
            if id(p.node) in feeds_host or id(p.node) in shape_only:
                continue
            if any(some_host_use(o) for o in p.node.outputs):
                feeds_host.add(id(p.node))
                grew = True

    def shape_value(v: ir.Value | None) -> bool:
        """On the host and derived from shapes or constants, not from a graph input."""
        if v is not None and v.const_value is None and v.is_graph_input():
            return False
        return host_value(v)

    moved = 0
    changed = True
    while changed:
        changed = False
        for p in reversed(placed):
            if p.provider.device == "cpu" or id(p.node) in on_host:
                continue
            if id(p.node) in shape_only:
                if not all(host_value(v) for v in p.node.inputs):
                    continue
            elif id(p.node) not in feeds_host or not all(shape_value(v) for v in p.node.inputs):
                continue
            res = host.claim(p.info)
            if not isinstance(res, Claim):
                continue
            on_host.add(id(p.node))
            p.declined = [
                *p.declined,
                (p.provider.name, "moved to the host: it only computes shapes"),
            ]
            p.provider, p.claim, p.role = host, res, HOST_SHAPE
            moved += 1
            changed = True
    return moved


def check_fallback(placed: Sequence[PlacedNode], first: Provider) -> None:
    """With ``disable_fallback``, every compute node must stay on the first provider."""
    bad = [p for p in placed if p.role == COMPUTE and p.provider is not first]
    if not bad:
        return
    lines = [
        f"disable_fallback is set and {len(bad)} node(s) left {first.name!r}:",
    ]
    for p in bad[:20]:
        why = "; ".join(f"{prov}: {r}" for prov, r in p.declined) or "no reason given"
        lines.append(f"  - {p.info.describe()} -> {p.provider.name} ({why})")
    if len(bad) > 20:
        lines.append(f"  ... and {len(bad) - 20} more")
    raise FallbackError("\n".join(lines))


def ownership(providers: Sequence[Provider], opsets: dict[str, int]) -> Callable[[ir.Node], Any]:
    """A cheap guess at which provider a node will go to: the first with a kernel and dtypes.

    Fusion passes use it to keep to their provider's nodes; it builds no kernel,
    so a builder that later declines just sends the node on down the list.
    """
    from onnxep.providers.kernel import normalize_domain

    from .nodeinfo import value_info

    def owner(node: ir.Node) -> Any:
        domain = normalize_domain(node.domain)
        opset = opsets.get(domain, 1)
        dtypes = [None if v is None else value_info(v, None).dtype for v in node.inputs]
        for p in providers:
            spec = p.registry.lookup(domain, node.op_type, opset)
            if spec is not None and spec.dtype_refusal(node.op_type, dtypes) is None:
                return p
        return None

    return owner
