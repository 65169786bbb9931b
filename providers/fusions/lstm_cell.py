"""An unrolled LSTM cell's gate arithmetic -> onnxep::LSTMCell(gates, c_prev[, gates2]).

A tracing exporter writes each step of a ``torch.nn.LSTMCell`` loop as

    g = Add(x_proj, h_proj); i, f, c~, o = Split(g, 4, axis=-1)
    c = Add(Mul(Sigmoid(f), c_prev), Mul(Sigmoid(i), Tanh(c~)))
    h = Mul(Sigmoid(o), Tanh(c))

eleven nodes whose tensors are a few hundred values: the per-node cost, not the
arithmetic, is their time. One node computes the same from the Add's operands (or the
Split's input when it is not a single-use Add) and ``c_prev``, with outputs ``h`` and
``c``. The gates' roles are read from the structure, not the Split's output order:
the Tanh'd block is the cell input, the Sigmoid multiplying ``c_prev`` the forget
gate, the one multiplying the Tanh'd block the input gate, the one multiplying
``Tanh(c)`` the output gate (attribute ``gates``: their blocks in that order).

Matched on structure and dtypes only: a float32 rank-2 Split into four equal blocks
along the last axis whose outputs each feed one Sigmoid or Tanh and nothing else, and
every intermediate read only inside the match (``c`` and ``h`` may be read anywhere).

Tolerance-level: the CPU kernel's compiled tanh and logistic are within 3e-7 of
NumPy's, and the sums are not rounded between Add and the gates.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .anchored import AnchoredFusionPass
from .graph_reads import other_operand, sole_reader


def _is(node: ir.Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in ("", "ai.onnx")


def _four_equal(split: ir.Node, x: ir.Value) -> bool:
    a = split.attributes.get("axis")
    axis = 0 if a is None else int(a.value)
    if C.rank(x) != 2 or axis not in (1, -1) or len(split.outputs) != 4:
        return False
    sizes = None
    if len(split.inputs) > 1 and split.inputs[1] is not None:
        sizes = C.const(split.inputs[1])
        if sizes is None:
            return False
        sizes = [int(s) for s in sizes.reshape(-1)]
    elif "split" in split.attributes:
        sizes = [int(s) for s in split.attributes["split"].value]
    if sizes is not None and (len(sizes) != 4 or len(set(sizes)) != 1):
        return False
    width = C.dim(x, 1)
    return not (isinstance(width, int) and (width % 4 or (sizes and sizes[0] * 4 != width)))


def match(split: ir.Node) -> dict[str, Any] | None:
    """The nodes and values of one cell around ``split``, or None."""
    if not _is(split, "Split"):
        return None
    x = split.inputs[0]
    if x is None or x.dtype != ir.DataType.FLOAT or not _four_equal(split, x):
        return None
    acts = [sole_reader(v) for v in split.outputs]
    if any(n is None or len(n.inputs) != 1 for n in acts):
        return None
    kinds = [n.op_type if n.domain in ("", "ai.onnx") else "" for n in acts]
    if sorted(kinds) != ["Sigmoid", "Sigmoid", "Sigmoid", "Tanh"]:
        return None
    g_pos = kinds.index("Tanh")
    sig = {acts[k].outputs[0]: k for k in range(4) if k != g_pos}
    mul_ig = sole_reader(acts[g_pos].outputs[0])
    if not _is(mul_ig, "Mul"):
        return None
    s_i = other_operand(mul_ig, acts[g_pos].outputs[0])
    if s_i not in sig or sole_reader(s_i) is not mul_ig:
        return None
    add_c = sole_reader(mul_ig.outputs[0])
    if not _is(add_c, "Add"):
        return None
    mul_fc = other_operand(add_c, mul_ig.outputs[0])
    mul_fc = None if mul_fc is None else mul_fc.producer()
    if not _is(mul_fc, "Mul") or sole_reader(mul_fc.outputs[0]) is not add_c:
        return None
    s_f = next((v for v in mul_fc.inputs if v in sig and v is not s_i), None)
    if s_f is None or sole_reader(s_f) is not mul_fc:
        return None
    c_prev = other_operand(mul_fc, s_f)
    c = add_c.outputs[0]
    tanh_c = [u.node for u in c.uses() if _is(u.node, "Tanh")]
    if len(tanh_c) != 1:
        return None
    mul_h = sole_reader(tanh_c[0].outputs[0])
    if not _is(mul_h, "Mul"):
        return None
    s_o = other_operand(mul_h, tanh_c[0].outputs[0])
    if s_o not in sig or s_o in (s_i, s_f) or sole_reader(s_o) is not mul_h:
        return None
    if c_prev is None or c_prev.dtype != ir.DataType.FLOAT:
        return None
    nodes = [split, *acts, mul_ig, add_c, mul_fc, tanh_c[0], mul_h]
    operands = [x]
    add = x.producer()
    if (
        _is(add, "Add")
        and sole_reader(x) is split
        and all(v is not None and v.dtype == ir.DataType.FLOAT for v in add.inputs)
        and C.same_shape(add.inputs[0], add.inputs[1]) is None
    ):
        operands = list(add.inputs)
        nodes.append(add)
    return {
        "nodes": nodes,
        "operands": operands,
        "c_prev": c_prev,
        "gates": [sig[s_i], sig[s_f], g_pos, sig[s_o]],
        "h": mul_h.outputs[0],
        "c": c,
        "at": add_c,
    }


class FuseLSTMCell(AnchoredFusionPass):
    """An unrolled LSTM step's gate arithmetic -> onnxep::LSTMCell. Tolerance-level (see
    module)."""

    name = "fuse_lstm_cell"
    exact = False
    op_type = "LSTMCell"
    rule = "lstm_cell"

    def match(self, node: ir.Node) -> dict[str, Any] | None:
        return match(node)

    def build(self, m: dict[str, Any], name: str) -> tuple[ir.Node, list[ir.Value]]:
        a, *b = m["operands"]
        fused = ir.node(
            "LSTMCell",
            [a, m["c_prev"], *b],
            {"gates": m["gates"]},
            domain=DOMAIN,
            num_outputs=2,
            name=name,
        )
        return fused, [m["h"], m["c"]]
