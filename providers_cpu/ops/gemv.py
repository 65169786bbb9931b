"""One row times a large constant float32 weight ``[K, N]`` (a decode step's projections,
its lm_head): a compiled GEMV, K cut in pieces split over the cores.

A decode step reads every weight once: it is memory-bound, its time how fast the weights
stream in. NumPy's ``a.dot(W)`` (OpenBLAS's ``sgemv_n`` on the row-major weight)
streamed 3-10 GB/s on the 2-core Zen 4 machine for [896, 896] up to [4864, 896], where
onnxruntime's MLAS streamed 17-19; and OpenBLAS's worker thread busy-waits (sched_yield)
for a while after each call, taking the second core from whatever the process runs
next (onnxruntime's decode step ran 1.5x its own time right after onnxep's).

Here each piece of K (whole rows: one contiguous stretch of the weight) is summed into its
own partial row, the pieces claimed by the caller and ``handoff``'s helper (whose spin
after a split is bounded by ``SPIN_US``; OpenBLAS's threads stay asleep), and the
partials added in order. The pieces depend on the shape alone and each sum runs in row
order (multiply-adds), so the bits do not depend on the threads; they differ from
BLAS's in the last places.
"""

from __future__ import annotations

import os

import numpy as np

from .. import jit
from .nn_cpu import parallel_compiled

#: ``0``: one row runs NumPy's GEMV as before (A/B, tests)
MODE = os.environ.get("ONNXEP_CPU_GEMV", "1").strip()
#: the weight's elements from which a row runs here (below, OpenBLAS's call is short and
#: its threads are not asked for: it runs small GEMVs on one thread)
MIN_SIZE = 1 << 18
#: multiply-adds from which the pieces are split over the threads: the product is
#: memory-bound, so even [896, 896] gains a second core's bandwidth (199 -> 149 us,
#: [896, 1152] 243 -> 179, weights cold, the helper spinning from the last split) where
#: the compiled kernels' bound (``nn_cpu.COMPILED_MIN``, 2^22) kept them on one thread
SPLIT_MIN = MIN_SIZE
#: K is cut into this many pieces (fewer for a short K), each run of whole rows one
#: contiguous stretch of the weight summed into its own partial row; the partials are
#: added in order. Cutting N instead (threads take blocks of columns, each row read as
#: runs of the block's width) was 1.1-1.6x slower on every shape tried, lm_head's
#: [896, 151936] included (docs/cpu_kernels.md).
PIECES = 8
#: rows a piece at least
PIECE_ROWS = 64
_F32 = np.dtype(np.float32)


def fits(w: np.ndarray) -> bool:
    """A C-contiguous float32 weight ``w`` [K, N] large enough for the compiled loop."""
    return (
        MODE != "0"
        and w.dtype == _F32
        and w.ndim == 2
        and w.size >= MIN_SIZE
        and w.flags.c_contiguous
        and jit.ENABLED
    )


def row_times(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a.reshape(K) @ w`` as a [1, N] array (the caller reshapes). The pieces and blocks
    depend on the shape alone, so the bits do not depend on the threads."""
    k, n = w.shape
    x = np.ascontiguousarray(a).reshape(k)
    y = np.empty((1, n), _F32)
    rows_loop, add = _loops()
    pieces = max(1, min(PIECES, k // PIECE_ROWS))
    part = np.empty((pieces, n), _F32)
    parallel_compiled(pieces, k * n, rows_loop, (x, w, pieces), (part,), split_min=SPLIT_MIN)
    add(part, y[0])
    return y


def _gemv_rows(x, w, pieces, p0, p1, part):
    """part[p] = the sums over piece p's rows of K, for pieces p0..p1."""
    k, n = w.shape
    for p in range(p0, p1):
        q0 = k * p // pieces
        q1 = k * (p + 1) // pieces
        _rows_into(x, w, q0, q1, 0, n, part[p])


def _rows_into(x, w, q0, q1, b0, b1, yb):
    """yb[j] = sum over rows q0..q1 of x[q] * w[q, b0 + j], rows in order, eight a pass."""
    m = b1 - b0
    # views indexed from 0: numba then knows an index is not negative, drops its
    # wraparound test and LLVM vectorises the loop (indexed from b0 it ran scalar, 7x
    # slower); eight rows a pass load and store the sums an eighth as often (four a pass:
    # 1.1-1.15x the time on [896, 1152] and [4864, 896])
    row = w[q0, b0:b1]
    xq = x[q0]
    for j in range(m):
        yb[j] = xq * row[j]
    q = q0 + 1
    while q + 8 <= q1:
        x0, x1, x2, x3 = x[q], x[q + 1], x[q + 2], x[q + 3]
        x4, x5, x6, x7 = x[q + 4], x[q + 5], x[q + 6], x[q + 7]
        r0, r1, r2, r3 = w[q, b0:b1], w[q + 1, b0:b1], w[q + 2, b0:b1], w[q + 3, b0:b1]
        r4, r5, r6, r7 = w[q + 4, b0:b1], w[q + 5, b0:b1], w[q + 6, b0:b1], w[q + 7, b0:b1]
        for j in range(m):
            s = ((yb[j] + x0 * r0[j]) + x1 * r1[j]) + x2 * r2[j]
            s = (((s + x3 * r3[j]) + x4 * r4[j]) + x5 * r5[j]) + x6 * r6[j]
            yb[j] = s + x7 * r7[j]
        q += 8
    while q < q1:
        xq = x[q]
        row = w[q, b0:b1]
        for j in range(m):
            yb[j] += xq * row[j]
        q += 1


def _add_rows(part, y):
    """y = part[0] + part[1] + ... in order."""
    n = y.shape[0]
    first = part[0]
    for j in range(n):
        y[j] = first[j]
    for p in range(1, part.shape[0]):
        row = part[p]
        for j in range(n):
            y[j] += row[j]


# contract: multiply-adds, in the vector loops and their remainders alike (the sums along
# K are never reordered, so no reassoc). No nnan/ninf: NaN and infinity propagate.
_OPTS = dict(fastmath={"contract"}, helpers=("_rows_into",))
_rows = jit.lazy(_gemv_rows, **_OPTS)
_add = jit.lazy(_add_rows)


def _loops():
    return _rows(), _add()
