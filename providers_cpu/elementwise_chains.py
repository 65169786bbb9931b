"""Chains of float32 elementwise nodes -> onnxep::ElementwiseChain (one kernel call).

A chain is ``MIN_LINKS`` or more Add/Sub/Mul/Div/Relu/Neg/Abs/Sqrt/Reciprocal nodes of float32
values where each node's output is read only by the next node, once, and is not a graph
output. On a few elements each such node costs one NumPy call (about 0.35 us here, the
executor's per-node floor in ``bench/overhead.py``) and the same again per node in the
plan; the fused node is one compiled pass over its output (``ops/chain_loops.py``).
Exact: the kernel rounds every step to float32 as the unfused nodes do (see there), and
without numba, or for shapes the pass cannot take, it runs the nodes' own NumPy calls.

The pass runs only where numba is importable and wanted (the kernel's compiled pass is
the gain), on the CPU provider's nodes, in every graph (If branches and loop bodies
too), after the other CPU fusions (a Relu after a Conv stays in FusedConv).
"""

from __future__ import annotations

import onnx_ir as ir

from onnxep.providers.fusions.graph_edits import take_over
from onnxep.providers.fusions.naming import Names, graphs
from onnxep.providers.rewrite import FusionPass

from .ops.op_elementwise_chain import OPS

_INDEX = {op: i for i, op in enumerate(OPS)}
_BINARY = {"Add", "Sub", "Mul", "Div"}
_FLOAT = ir.DataType.FLOAT
#: Links a chain needs to be fused. The fused node's call costs about 3 us here (numba's
#: dispatch, the plan lookup, the output), a small NumPy node about 1: three-link chains
#: were faster alone but made the romanizer decoder and akiki VAD 4-6% slower in a run
#: (docs/cpu_kernels.md); five links and more won alone and cost nothing in the runs.
MIN_LINKS = 5
#: Inputs that are not constants a fused node may read (chain_loops.FED, which this module
#: does not import: that would import numba at session creation).
FED = 4


def _fed(v: ir.Value) -> bool:
    """Read at run time: not a constant, or an initializer a feed may override."""
    return v.const_value is None or v.is_graph_input()


class FuseElementwiseChains(FusionPass):
    """Chains of float32 elementwise nodes -> onnxep::ElementwiseChain. Exact (see module)."""

    name = "fuse_elementwise_chains"
    exact = True

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.can_emit("onnxep", "ElementwiseChain"):
            return ir.passes.PassResult(model, False)
        names = Names(model.graph)
        changed = False
        for graph in list(graphs(model.graph)):
            changed |= self._graph(graph, names)
        return ir.passes.PassResult(model, changed)

    def _link(self, node: ir.Node) -> bool:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _INDEX or node.attributes:
            return False  # attributes: opset 1-6 broadcast/axis/consumed_inputs forms
        want = 2 if node.op_type in _BINARY else 1
        if len(node.inputs) != want or len(node.outputs) != 1:
            return False
        if any(v is None or v.dtype != _FLOAT for v in (*node.inputs, node.outputs[0])):
            return False
        return self.owns(node)

    def _next(self, node: ir.Node, graph: ir.Graph, taken: set[int]) -> ir.Node | None:
        v = node.outputs[0]
        uses = v.uses()
        if v.is_graph_output() or len(uses) != 1:
            return None
        nxt = uses[0].node
        if nxt.graph is not graph or id(nxt) in taken or not self._link(nxt):
            return None
        if sum(x is v for x in nxt.inputs) != 1:
            return None  # v * v: the chain's value on both sides
        return nxt

    def _graph(self, graph: ir.Graph, names: Names) -> bool:
        taken: set[int] = set()
        chains = []
        for node in list(graph):
            if id(node) in taken or not self._link(node):
                continue
            chain = [node]
            fed = {id(v) for v in node.inputs if _fed(v)}
            while (nxt := self._next(chain[-1], graph, taken)) is not None:
                more = fed | {
                    id(v) for v in nxt.inputs if v is not chain[-1].outputs[0] and _fed(v)
                }
                if len(more) > FED:
                    break  # the compiled pass takes FED inputs that are not constants
                fed = more
                chain.append(nxt)
            taken.update(id(n) for n in chain)
            if len(chain) >= MIN_LINKS:
                chains.append(chain)
        for chain in chains:
            self._fuse(graph, chain, names)
        return bool(chains)

    def _fuse(self, graph: ir.Graph, chain: list[ir.Node], names: Names) -> None:
        first = chain[0]
        inputs: list[ir.Value] = [first.inputs[0]]
        ops, operands, right = [], [], []

        def index(v: ir.Value) -> int:
            for i, x in enumerate(inputs):
                if x is v:
                    return i
            inputs.append(v)
            return len(inputs) - 1

        value = first.inputs[0]  # the chain's value before each step
        for node in chain:
            ops.append(_INDEX[node.op_type])
            if node.op_type in _BINARY:
                a, b = node.inputs
                on_right = b is value and a is not value
                operands.append(index(a if on_right else b))
                right.append(int(on_right))
            else:
                operands.append(-1)
                right.append(0)
            value = node.outputs[0]
        last = chain[-1]
        fused = ir.Node(
            "onnxep",
            "ElementwiseChain",
            inputs,
            attributes=[
                ir.AttrInt64s("ops", ops),
                ir.AttrInt64s("operands", operands),
                ir.AttrInt64s("chain_right", right),
            ],
            name=names.fresh(f"{last.name or 'chain'}/ElementwiseChain"),
            num_outputs=1,
        )
        graph.insert_after(last, fused)
        take_over(last.outputs[0], fused.outputs[0])
        for node in reversed(chain):
            graph.remove(node, safe=True)
        self.count += 1
