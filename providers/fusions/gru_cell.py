"""An unrolled GRU cell's gate arithmetic -> onnxep::GRUCell(gi, gh, h_prev).

A tracing exporter writes each step of a hand-written or ``torch.nn.GRUCell`` loop as

    gi = Gemm(x, W_ih, b_ih); gh = Gemm(h_prev, W_hh, b_hh)
    i_r, i_z, i_n = Slice(gi) x 3; h_r, h_z, h_n = Slice(gh) x 3
    r = Sigmoid(Add(i_r, h_r)); z = Sigmoid(Add(i_z, h_z))
    n = Tanh(Add(i_n, Mul(r, h_n)))
    h = Add(Mul(Sub(1, z), n), Mul(z, h_prev))

sixteen nodes besides the products, on a few hundred values each: the per-node cost,
not the arithmetic, is their time. One node computes ``h`` from ``gi``, ``gh`` and
``h_prev``. The gates' roles come from the structure (the block added inside the Tanh
is ``n``'s, the Sigmoid scaling ``gh``'s block there is ``r``, the one under ``1 - z``
and times ``h_prev`` is ``z``), and which of the two products is ``gh`` from where
``r`` multiplies; each block's offset is read from its Slice (attribute ``offsets``:
the r, z and n blocks of ``gi`` then of ``gh``), so any gate order and either operand
order of every Add and Mul match.

Matched on structure and dtypes only: float32 rank-2 ``gi`` and ``gh`` whose last dims
are static, six Slices with constant bounds along the last axis, step 1, each a block
of the same width ``H`` inside its source, and every intermediate read only inside the
match (``h`` anywhere; ``z`` by exactly its Sub and its Mul).

Tolerance-level: the CPU kernel's compiled tanh and logistic are within 3e-7 of
NumPy's, and the gate sums are not rounded between nodes.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .anchored import AnchoredFusionPass
from .graph_reads import other_operand, sole_reader

_F32 = ir.DataType.FLOAT


def _is(node: ir.Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in ("", "ai.onnx")


def _producer(v: ir.Value | None, op: str) -> ir.Node | None:
    """``v``'s producer when it is ``op`` and ``v`` is read by nothing else."""
    if v is None:
        return None
    p = v.producer()
    return p if _is(p, op) and sole_reader(v) is not None else None


def _one(v: ir.Value | None) -> int | None:
    """The single integer a constant 1-element tensor holds, else None."""
    arr = C.const(v)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "iu":
        return None
    return int(arr.reshape(()))


def _block(v: ir.Value | None) -> tuple[ir.Value, int, int, ir.Node] | None:
    """(source, start, width, Slice) of a single-use Slice of a float32 rank-2 source along its
    last axis with constant bounds and step 1, the block inside the source's static last
    dim; else None."""
    s = _producer(v, "Slice")
    if s is None or len(s.inputs) < 3:
        return None
    src = s.inputs[0]
    if src is None or src.dtype != _F32 or C.rank(src) != 2:
        return None
    width = C.dim(src, 1)
    if not isinstance(width, int):
        return None
    start, end = _one(s.inputs[1]), _one(s.inputs[2])
    axis = _one(s.inputs[3]) if len(s.inputs) > 3 and s.inputs[3] is not None else 0
    step = _one(s.inputs[4]) if len(s.inputs) > 4 and s.inputs[4] is not None else 1
    if start is None or end is None or axis not in (1, -1) or step != 1:
        return None
    if start < 0:
        start += width
    if end < 0:
        end += width
    end = min(end, width)
    if not 0 <= start < end:
        return None
    return src, start, end - start, s


def _split_pair(add: ir.Node | None) -> tuple[tuple, tuple] | None:
    """The two Slice blocks an Add of two blocks sums, else None."""
    if not _is(add, "Add"):
        return None
    a, b = _block(add.inputs[0]), _block(add.inputs[1])
    return None if a is None or b is None else (a, b)


def _sigmoid_of_pair(v: ir.Value | None) -> tuple[ir.Node, ir.Node, tuple, tuple] | None:
    """(Sigmoid, Add, block, block) where ``v`` is Sigmoid(Add(block, block))."""
    sig = None if v is None else v.producer()
    if not _is(sig, "Sigmoid"):
        return None
    add = _producer(sig.inputs[0], "Add")
    pair = _split_pair(add)
    return None if pair is None else (sig, add, *pair)


def _oriented(pair: tuple[tuple, tuple], gi: ir.Value, gh: ir.Value) -> tuple[int, int] | None:
    """The (gi offset, gh offset) of a pair of blocks, one from each source, else None."""
    a, b = pair
    if a[0] is gi and b[0] is gh:
        return a[1], b[1]
    if a[0] is gh and b[0] is gi:
        return b[1], a[1]
    return None


def match(tanh: ir.Node) -> dict[str, Any] | None:
    """The nodes and values of one GRU step around its ``n`` gate's Tanh, or None."""
    if not _is(tanh, "Tanh") or tanh.outputs[0].dtype != _F32:
        return None
    add_n = _producer(tanh.inputs[0], "Add")
    if add_n is None:
        return None
    for i_n_v, mul_v in (add_n.inputs, add_n.inputs[::-1]):
        i_n, mul_rn = _block(i_n_v), _producer(mul_v, "Mul")
        if i_n is None or mul_rn is None:
            continue
        for r_v, h_n_v in (mul_rn.inputs, mul_rn.inputs[::-1]):
            h_n, r = _block(h_n_v), _sigmoid_of_pair(r_v)
            if h_n is None or r is None or sole_reader(r_v) is not mul_rn:
                continue
            found = _rest(tanh, add_n, mul_rn, i_n, h_n, r)
            if found is not None:
                return found
    return None


def _rest(tanh, add_n, mul_rn, i_n, h_n, r) -> dict[str, Any] | None:
    gi, gh = i_n[0], h_n[0]
    if gi is gh:
        return None
    H = i_n[2]
    r_sig, r_add, *r_pair = r
    r_off = _oriented(tuple(r_pair), gi, gh)
    if r_off is None:
        return None
    n = tanh.outputs[0]
    mul_n = sole_reader(n)
    if not _is(mul_n, "Mul"):
        return None
    sub_v = other_operand(mul_n, n)
    sub = _producer(sub_v, "Sub")
    one = None if sub is None else sub.inputs[0]
    if one is None or C.scalar(one) != 1.0 or C.rank(one) not in (0, 1, 2) or one.dtype != _F32:
        return None
    z_v = sub.inputs[1]
    z = _sigmoid_of_pair(z_v)
    if z is None:
        return None
    z_sig, z_add, *z_pair = z
    z_off = _oriented(tuple(z_pair), gi, gh)
    if z_off is None:
        return None
    readers = [u.node for u in z_v.uses()]
    if z_v.is_graph_output() or len(readers) != 2 or sub not in readers:
        return None
    mul_zh = next(nd for nd in readers if nd is not sub)
    if not _is(mul_zh, "Mul") or mul_zh.inputs[0] is mul_zh.inputs[1]:
        return None
    h_prev = other_operand(mul_zh, z_v)
    add_h = sole_reader(mul_n.outputs[0])
    if (
        h_prev is None
        or h_prev.dtype != _F32
        or not _is(add_h, "Add")
        or sole_reader(mul_zh.outputs[0]) is not add_h
        or other_operand(add_h, mul_n.outputs[0]) is not mul_zh.outputs[0]
    ):
        return None
    blocks = [*r_pair, *z_pair, i_n, h_n]
    if any(b[2] != H for b in blocks):
        return None
    hd = C.dim(h_prev, -1)
    if isinstance(hd, int) and hd != H:
        return None
    nodes = [
        *(b[3] for b in blocks),
        r_add,
        r_sig,
        z_add,
        z_sig,
        mul_rn,
        add_n,
        tanh,
        sub,
        mul_n,
        mul_zh,
        add_h,
    ]
    if len({id(nd) for nd in nodes}) != len(nodes):
        return None
    return {
        "nodes": nodes,
        "gi": gi,
        "gh": gh,
        "h_prev": h_prev,
        "offsets": [r_off[0], z_off[0], i_n[1], r_off[1], z_off[1], h_n[1]],
        "hidden": H,
        "h": add_h.outputs[0],
        "at": add_h,
    }


class FuseGRUCell(AnchoredFusionPass):
    """An unrolled GRU step's gate arithmetic -> onnxep::GRUCell. Tolerance-level (see
    module)."""

    name = "fuse_gru_cell"
    exact = False
    op_type = "GRUCell"
    rule = "gru_cell"

    def match(self, node: ir.Node) -> dict[str, Any] | None:
        return match(node)

    def build(self, m: dict[str, Any], name: str) -> tuple[ir.Node, list[ir.Value]]:
        fused = ir.node(
            "GRUCell",
            [m["gi"], m["gh"], m["h_prev"]],
            {"offsets": m["offsets"], "hidden_size": m["hidden"]},
            domain=DOMAIN,
            name=name,
        )
        return fused, [m["h"]]
