"""Small device islands moved to the host: one of the candidates ``placement="measured"`` times.

A device island is a connected group of compute nodes placed on one device
provider (connected through the values they pass each other), every other
neighbour of which is on the host: a CPU node, a constant, a graph input or
a graph output. An island of fewer than ``max_nodes`` nodes pays a copy in and
a copy out, and a launch per node, to run a few ops on the device; on the
host it pays none of that. Whether that is faster depends on what the nodes
compute, so this module only makes the placement and the session measures it
(see docs/placement.md).

An island moves whole or not at all (moving part of it would add copies),
and not when a node holds a subgraph (If, Loop, Scan: their bodies are
compiled for the placement they were given) or when the CPU provider declines
one of its nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnxep.providers.provider import Claim, Provider

from .partition import COMPUTE, PlacedNode

#: How a moved node's placement reason starts; the session leaves these out of its
#: fallback warning (the user asked for the measurement that moved them).
MOVED_BY_MEASUREMENT = "moved to the host by placement='measured'"


def _has_subgraph(node: ir.Node) -> bool:
    return any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    )


def device_islands(placed: Sequence[PlacedNode]) -> list[list[PlacedNode]]:
    """The islands of ``placed``: maximal groups of compute nodes on one device provider
    joined by the values they pass each other, in graph order; each as its nodes in
    graph order. A group that touches another device provider's node is not an island
    (it is not between host nodes) and is left out."""
    by_node = {id(p.node): p for p in placed}
    parent: dict[int, int] = {}

    def on_device(p: PlacedNode | None) -> bool:
        return p is not None and p.role == COMPUTE and p.provider.device != "cpu"

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for p in placed:
        if on_device(p):
            parent[id(p.node)] = id(p.node)
    foreign: set[int] = set()  # roots of groups that touch another device provider
    for p in placed:
        if not on_device(p):
            continue
        for v in p.node.inputs:
            prod = None if v is None else v.producer()
            q = None if prod is None else by_node.get(id(prod))
            if not on_device(q):
                continue
            if q.provider is p.provider:
                parent[find(id(q.node))] = find(id(p.node))
            else:
                foreign.update((id(p.node), id(q.node)))
    groups: dict[int, list[PlacedNode]] = {}
    for p in placed:
        if on_device(p):
            groups.setdefault(find(id(p.node)), []).append(p)
    bad = {find(k) for k in foreign}
    return [g for root, g in groups.items() if root not in bad]


def move_small_islands_to_host(
    placed: list[PlacedNode], host: Provider | None, max_nodes: int
) -> int:
    """Re-place on ``host`` every device island of fewer than ``max_nodes`` nodes that the
    host can run whole; returns how many nodes moved."""
    if host is None or max_nodes <= 1:
        return 0
    moved = 0
    for island in device_islands(placed):
        if len(island) >= max_nodes or any(_has_subgraph(p.node) for p in island):
            continue
        claims = [host.claim(p.info) for p in island]
        if not all(isinstance(c, Claim) for c in claims):
            continue
        why = (
            f"{MOVED_BY_MEASUREMENT}: an island of {len(island)} node(s) "
            f"(fewer than {max_nodes}) between host nodes"
        )
        for p, claim in zip(island, claims):
            p.declined = [*p.declined, (p.provider.name, why)]
            p.provider, p.claim = host, claim
            moved += 1
    return moved
