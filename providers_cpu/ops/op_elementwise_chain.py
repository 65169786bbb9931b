"""onnxep::ElementwiseChain: a chain of float32 Add/Sub/Mul/Div/Relu/Neg/Abs/Sqrt/Reciprocal
nodes, each reading the one before it (``providers_cpu/elementwise_chains.py`` builds it).

Attributes, one entry per step in the chain's order: ``ops`` (the ONNX op, ``OPS``'s
index), ``operands`` (a binary step's other input, as an index into the node's inputs;
-1 for a unary step) and ``chain_right`` (1 where the chain's value was the step's right
operand). Input 0 is the value the chain starts from.

With numba (``chain_loops``) one compiled pass runs the chain when the shapes allow it
(float32 throughout, each operand broadcasting into the output as one run of dims;
decided once per input shapes). Otherwise, and
without numba, the steps run as the unfused nodes' NumPy calls, one after the other: the
same values either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .. import jit
from .op_relu import _relu

OPS = ("Add", "Sub", "Mul", "Div", "Relu", "Neg", "Abs", "Sqrt", "Reciprocal")
_BINARY = (np.add, np.subtract, np.multiply, np.divide)
_UNARY = (_relu, np.negative, np.abs, np.sqrt, np.reciprocal)
#: Plans kept per node (input shapes); more distinct shapes start over.
_PLANS = 64
_NO_PLAN = object()
_EMPTY = np.zeros(0, np.float32)


def _numpy_steps(ops: list[int], operands: list[int], right: list[int]):
    """The unfused nodes' calls, in order."""

    def run(xs: tuple[np.ndarray, ...]) -> np.ndarray:
        v = xs[0]
        for op, j, r in zip(ops, operands, right):
            if op >= len(_BINARY):
                v = _UNARY[op - len(_BINARY)](v)
            else:
                f = _BINARY[op]
                v = f(xs[j], v) if r else f(v, xs[j])
        return np.asarray(v)

    return run


def _run_of_dims(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, int] | None:
    """(inner, count) of an operand of ``shape`` broadcast into ``out``, or None when its
    varying dims are not one run (or it would not broadcast)."""
    if len(shape) > len(out):
        return None
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    varying = []
    for d, (a, b) in enumerate(zip(padded, out)):
        if a == b and b != 1:
            varying.append(d)
        elif a != 1:
            return None
    if not varying:
        return 1, 1
    lo, hi = varying[0], varying[-1]
    if any(out[d] != 1 and d not in varying for d in range(lo, hi + 1)):
        return None
    count = int(np.prod(out[lo : hi + 1]))
    inner = int(np.prod(out[hi + 1 :]))
    return max(inner, 1), count


class _Plan:
    """How the compiled pass runs the chain for one tuple of input shapes."""

    __slots__ = ("shape", "meta", "consts")

    def __init__(self, shape, meta, consts):
        self.shape = shape
        self.meta = meta
        self.consts = consts


def _plan(xs, ops, operands, right, consts, slots, loops) -> Any:
    if any(x.dtype != np.float32 for x in xs):
        return _NO_PLAN
    try:
        out = tuple(np.broadcast_shapes(*(x.shape for x in xs)))
    except ValueError:
        return _NO_PLAN  # the NumPy steps raise it
    codes, reads = [loops.LOAD], [0]
    for op, j, r in zip(ops, operands, right):
        if op >= len(_BINARY):
            codes.append(loops.RELU + op - len(_BINARY))
            reads.append(-1)
            continue
        sub = loops.RSUB if r else loops.SUB
        div = loops.RDIV if r else loops.DIV
        codes.append((loops.ADD, sub, loops.MUL, div)[op])
        reads.append(j)
    meta = np.zeros((5, len(codes)), np.intp)
    meta[loops.CODE] = codes
    packed, at, where = [], 0, {}
    for k, j in enumerate(reads):
        if j < 0:
            continue
        run = _run_of_dims(xs[j].shape, out)
        if run is None:
            return _NO_PLAN
        meta[loops.INNER, k], meta[loops.COUNT, k] = run
        if consts[j] is None:
            meta[loops.SOURCE, k] = slots[j]
            continue
        if j not in where:
            where[j] = at
            packed.append(np.ascontiguousarray(consts[j], np.float32).reshape(-1))
            at += packed[-1].size
        meta[loops.OFFSET, k] = where[j]
    return _Plan(out, meta, np.concatenate(packed) if packed else _EMPTY)


@kernel("ElementwiseChain", domain="onnxep", dtypes=["float"])
def elementwise_chain(node: NodeInfo, xp: Any):
    ops = [int(v) for v in node.attr("ops")]
    operands = [int(v) for v in node.attr("operands")]
    right = [int(v) for v in node.attr("chain_right")]
    n_in = node.num_inputs
    if not ops or len(operands) != len(ops) or len(right) != len(ops):
        raise NotSupported("ElementwiseChain: ops, operands and chain_right need one entry a step")
    for op, j in zip(ops, operands):
        if not 0 <= op < len(OPS) or (op < len(_BINARY) and not 0 <= j < n_in):
            raise NotSupported(
                f"ElementwiseChain: step {op} (an op index of {len(OPS)}) reads input {j} of {n_in}"
            )
    steps = _numpy_steps(ops, operands, right)
    loops = None
    if jit.ENABLED:
        from . import chain_loops as loops
    if loops is None:
        return lambda *xs: (steps(xs),)
    consts = [node.const_input(i) for i in range(n_in)]
    fed = [i for i in range(n_in) if consts[i] is None]
    if len(fed) > loops.FED:
        return lambda *xs: (steps(xs),)
    slots = {j: k + 1 for k, j in enumerate(fed)}
    plans: dict[tuple, Any] = {}
    call = _caller(loops.run, fed)

    def run(*xs):
        key = tuple([x.shape for x in xs])
        p = plans.get(key)
        if p is None:
            if len(plans) >= _PLANS:
                plans.clear()
            p = plans[key] = _plan(xs, ops, operands, right, consts, slots, loops)
        if p is _NO_PLAN:
            return (steps(xs),)
        out = np.empty(p.shape, np.float32)
        call(out.reshape(-1), p, xs)
        return (out,)

    return run


def _caller(run_chain, fed: list[int]):
    """``run_chain`` on a plan and the fed inputs, flat (reshape(-1): a view of a C-contiguous
    input, a C-order copy of a strided one), unused operand slots empty. One closure per
    count: building the argument list in a loop cost more than the call's arithmetic."""
    e = _EMPTY
    if not fed:
        return lambda out, p, xs: run_chain(out, p.meta, p.consts, e, e, e, e)
    a = fed[0]
    if len(fed) == 1:
        return lambda out, p, xs: run_chain(out, p.meta, p.consts, xs[a].reshape(-1), e, e, e)
    b = fed[1]
    if len(fed) == 2:
        return lambda out, p, xs: run_chain(
            out, p.meta, p.consts, xs[a].reshape(-1), xs[b].reshape(-1), e, e
        )
    c = fed[2]
    if len(fed) == 3:
        return lambda out, p, xs: run_chain(
            out, p.meta, p.consts, xs[a].reshape(-1), xs[b].reshape(-1), xs[c].reshape(-1), e
        )
    d = fed[3]
    return lambda out, p, xs: run_chain(
        out,
        p.meta,
        p.consts,
        xs[a].reshape(-1),
        xs[b].reshape(-1),
        xs[c].reshape(-1),
        xs[d].reshape(-1),
    )
