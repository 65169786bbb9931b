"""Add, Mul, Sub and Div of a feature map [N, C, ...] and one value per channel, in one pass.

A BatchNorm exported as Mul and Add (after a residual Add, where it cannot fold into the
Conv), an input normalisation, a squeeze-excite scale: the second operand is [C, 1, 1] or
[1, C, 1, 1]. NumPy broadcasts it with a zero stride, which its vector loops do not take:
[2, 256, 15, 40] * [1, 256, 1, 1] took 56 us against a 23 us copy of the map. The compiled
loop here reads each channel's value once and runs a vector loop over the channel's
positions: 25.5 us (one thread, Zen 5). Each output is the one IEEE operation NumPy does
(no fast-math, IEEE division), so the two paths give the same bits; without numba the
ufunc runs.
"""

from __future__ import annotations

import math

import numpy as np

from .. import jit

#: the operations, as the compiled loop's codes
ADD, SUB, MUL, DIV = 0, 1, 2, 3
#: maps below this many elements broadcast through NumPy: its call costs less than the
#: shape checks and the compiled call's dispatch
MIN_SIZE = 16384
#: ... and channels of fewer positions than this: over longer runs NumPy's own loop is
#: as fast ([1, 32, 48, 192]: 22.5 us against 24.6; [2, 64, 15, 40]: 13.1 against 5.5)
MAX_POSITIONS = 4096
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_UFUNC = {ADD: np.add, SUB: np.subtract, MUL: np.multiply, DIV: np.divide}


def per_channel(x: np.ndarray, v: np.ndarray) -> bool:
    """Whether ``v`` holds one value per channel of ``x`` ([N, C, ...], C-contiguous)
    broadcast over the rest: shape (C, 1, ...) or (1, C, 1, ...), both of one float dtype."""
    nd = x.ndim
    if nd < 3 or v.ndim > nd or v.ndim < nd - 1 or x.dtype != v.dtype or x.dtype not in _FLOATS:
        return False
    vs = v.shape
    lead = v.ndim - nd + 1  # 0 for (C, 1, ...), 1 for (1, C, 1, ...)
    if lead and vs[0] != 1:
        return False
    if vs[lead] != x.shape[1] or v.size != vs[lead]:  # the rest all ones
        return False
    return x.flags.c_contiguous


def candidate(node) -> bool:
    """Whether ``node``'s static types allow a per-channel operand: float32/float64 inputs,
    one of rank 3 or more and the other of a known (C, 1, ...) or (1, C, 1, ...) shape.

    Every other node keeps the generic kernel, whose direct form is NumPy's ufunc itself:
    the executor may then write its result into a dead input (an in-place step), which a
    wrapper in front of the ufunc would forbid for every Add and Mul of a graph.
    """
    if len(node.inputs) != 2 or any(node.input_dtype(i) not in _FLOATS for i in (0, 1)):
        return False
    for big, small in ((0, 1), (1, 0)):
        rank = node.inputs[big].rank
        vs = node.inputs[small].static_shape
        if rank is None or rank < 3 or vs is None or len(vs) not in (rank - 1, rank):
            continue
        lead = len(vs) - rank + 1
        if (lead and vs[0] != 1) or vs[lead] < 2 or any(d != 1 for d in vs[lead + 1 :]):
            continue
        c = node.inputs[big].shape[1]
        known = node.inputs[big].static_shape
        if known is not None and math.prod(known) < MIN_SIZE:
            continue  # never the compiled pass's (see binary)
        if not isinstance(c, int) or c == vs[lead]:
            return True
    return False


def _short(x: np.ndarray) -> bool:
    return x.size < MAX_POSITIONS * x.shape[0] * x.shape[1]


def binary(op: int):
    """``f(a, b)``: ``a op b`` with NumPy's broadcasting, one pass for a per-channel operand."""
    ufunc = _UFUNC[op]

    def f(a, b):
        # cheap tests first: this runs for every Add/Mul/Sub/Div of the graph, small or not
        if a.size >= MIN_SIZE and b.ndim > 1 and jit.ENABLED:
            if b.size == a.shape[1] and _short(a) and per_channel(a, b):
                return apply(a, b, op, False)
        elif b.size >= MIN_SIZE and a.ndim > 1 and jit.ENABLED:
            if a.size == b.shape[1] and _short(b) and per_channel(b, a):
                return apply(b, a, op, True)
        return ufunc(a, b)

    return f


def apply(x: np.ndarray, v: np.ndarray, op: int, swap: bool) -> np.ndarray:
    """``x op v`` (``v op x`` when ``swap``) for ``v`` that :func:`per_channel` accepts."""
    n, c = x.shape[0], x.shape[1]
    y = np.empty_like(x)
    if x.size:
        _loop()(
            x.reshape(n, c, -1), np.ascontiguousarray(v).reshape(c), op, swap, y.reshape(n, c, -1)
        )
    return y


def _channel_op(x, v, op, swap, out):
    """out[n, c, :] = x[n, c, :] op v[c] (v[c] op x[n, c, :] when ``swap``)."""
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            s = v[c]
            src = x[n, c]
            dst = out[n, c]
            if op == 0:
                for q in range(src.shape[0]):
                    dst[q] = src[q] + s
            elif op == 2:
                for q in range(src.shape[0]):
                    dst[q] = src[q] * s
            elif op == 1 and not swap:
                for q in range(src.shape[0]):
                    dst[q] = src[q] - s
            elif op == 1:
                for q in range(src.shape[0]):
                    dst[q] = s - src[q]
            elif not swap:
                for q in range(src.shape[0]):
                    dst[q] = src[q] / s
            else:
                for q in range(src.shape[0]):
                    dst[q] = s / src[q]


# error_model="numpy": x / 0 is inf or NaN, as NumPy's, not an exception
_loop = jit.lazy(_channel_op, error_model="numpy")
