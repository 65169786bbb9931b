"""Matrix products of a few rows: one compiled loop that reads the weight once, or one
GEMV a row.

OpenBLAS's SGEMM packs all of B on every call, and its kernels are at their worst for
2, 3, 5 or 6 rows: [2, 4096] x [4096, 400] took 281-297 us on one thread against two
GEMVs of 74 us (docs/cpu_kernels.md, "Products of a few rows"). A GEMV a row still
reads the whole weight once per row. With numba, 2 to 8 rows run :func:`_rows_nk`
instead: each pass over K reads four weight rows once for two rows of A (eight
running sums in registers), so the weight is read once per pair of rows and every
load feeds two multiply-adds ([2, 4096] x [400, 4096]^T: 82 us against two GEMVs'
137 and SGEMM's 292, one thread, Zen 5). Without numba, one to three rows run one GEMV
a row (NumPy calls a GEMV itself for one row) and four or more one SGEMM, where its
own kernels fit.

The rule is by shape alone, so a kernel gives the same bits whether its weight is a
constant or fed. The compiled sums run in an order LLVM picks for the vector width
(``reassoc``), fixed per column's place in its block of four and per row's place in
its pair, never by the thread split (threads take whole blocks of columns); they
differ from BLAS's in the last places, as BLAS's GEMV and SGEMM differ from each other.
"""

from __future__ import annotations

import numpy as np

from .. import jit
from .nn_cpu import parallel_rows

#: Without numba, A with at most this many rows runs one GEMV a row
ROWS = 3
#: With numba, A of 2 up to this many rows runs the compiled loop (at 8 rows SGEMM's
#: own kernels caught up: [8, 4096] x [4096, 400] 358 us against 353)
JIT_ROWS = 8
#: ... when the weight has at least this many elements (below, one SGEMM call costs
#: less than the calls)
MIN_SIZE = 32768
#: Multiply-adds below which the loop runs on the calling thread alone. A second
#: thread's hand-off and its own trip to the weight cost more than the split saves up to
#: here: [2, 4096] x [4096, 400] took 91 us on one thread and 122 on two, [4, 4096] x
#: [4096, 1024] 871 and 989; [8, 2048] x [2048, 2048] (2^25) 1474 and 734 (medians,
#: 2 cores shared with other benchmarks).
SPLIT_MIN = 1 << 25
_BLAS = (np.dtype(np.float32), np.dtype(np.float64))


def fits(a: np.ndarray, w: np.ndarray, k_axis: int) -> bool:
    """2-D ``a`` of a few rows against 2-D ``w`` whose axis ``k_axis`` is a's K, both of
    one BLAS dtype, ``w`` not tiny: a's rows run one GEMV each, or :func:`compiled`."""
    return (
        a.ndim == 2
        and w.ndim == 2
        and 0 < a.shape[0] <= (JIT_ROWS if jit.ENABLED else ROWS)
        and w.size >= MIN_SIZE
        and a.shape[1] == w.shape[k_axis]
        and a.dtype == w.dtype
        and w.dtype in _BLAS
    )


def compiled(a: np.ndarray) -> bool:
    """Whether ``a`` (which :func:`fits`) runs the compiled loop: two rows or more."""
    return a.shape[0] >= 2 and jit.ENABLED


def rows_times_transposed(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w.T`` for ``w`` [N, K] C-contiguous: the compiled loop, or ``w @ a[i]`` a row."""
    if compiled(a):
        return _rows_nk_run(a, w)
    y = np.empty((a.shape[0], w.shape[0]), w.dtype)
    for i in range(a.shape[0]):
        np.matmul(w, a[i], out=y[i])
    return y


def rows_times(a: np.ndarray, b: np.ndarray, bt: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` for ``b`` [K, N]: the compiled loop on ``bt`` (``b.T`` C-contiguous, made
    here when not given), or ``a[i] @ b`` a row."""
    if compiled(a):
        return _rows_nk_run(a, np.ascontiguousarray(b.T) if bt is None else bt)
    if a.shape[0] == 1:
        # NumPy's matmul runs one row as the same GEMV (bit for bit), without the loop's
        # output buffer and row views: 2 of a decode step's 7 us MatMul
        return np.matmul(a, b)
    y = np.empty((a.shape[0], b.shape[1]), b.dtype)
    for i in range(a.shape[0]):
        np.matmul(a[i], b, out=y[i])
    return y


def _rows_nk_run(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    m, n = a.shape[0], w.shape[0]
    y = np.empty((m, n), w.dtype)
    f = _loop()
    work = m * n * a.shape[1]
    if work < SPLIT_MIN:
        f(a, w, 0, n, y)
        return y
    # whole blocks of four columns per call, so a column's sums do not depend on the split
    blocks = (n + 3) // 4
    parallel_rows(blocks, work, lambda b0, b1: f(a, w, 4 * b0, min(4 * b1, n), y))
    return y


def _rows_nk(a, w, n0, n1, out):
    """out[i, n] = sum_k a[i, k] * w[n, k] for columns n0..n1 (n0 a multiple of 4).

    Rows go in pairs (the last alone when odd), columns in blocks of four (the block
    cut at N in fewer), so each pass over K reads four weight rows once for two rows of
    A, with eight running sums.
    """
    m, k = a.shape
    z = w.dtype.type(0)
    i = 0
    while i < m:
        if i + 2 <= m:
            a0 = a[i]
            a1 = a[i + 1]
            n = n0
            while n + 4 <= n1:
                w0 = w[n]
                w1 = w[n + 1]
                w2 = w[n + 2]
                w3 = w[n + 3]
                s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = z
                for q in range(k):
                    x0 = a0[q]
                    x1 = a1[q]
                    v0 = w0[q]
                    v1 = w1[q]
                    v2 = w2[q]
                    v3 = w3[q]
                    s00 += x0 * v0
                    s01 += x0 * v1
                    s02 += x0 * v2
                    s03 += x0 * v3
                    s10 += x1 * v0
                    s11 += x1 * v1
                    s12 += x1 * v2
                    s13 += x1 * v3
                out[i, n] = s00
                out[i, n + 1] = s01
                out[i, n + 2] = s02
                out[i, n + 3] = s03
                out[i + 1, n] = s10
                out[i + 1, n + 1] = s11
                out[i + 1, n + 2] = s12
                out[i + 1, n + 3] = s13
                n += 4
            while n < n1:
                wr = w[n]
                s0 = s1 = z
                for q in range(k):
                    v = wr[q]
                    s0 += a0[q] * v
                    s1 += a1[q] * v
                out[i, n] = s0
                out[i + 1, n] = s1
                n += 1
            i += 2
        else:
            a0 = a[i]
            n = n0
            while n + 4 <= n1:
                w0 = w[n]
                w1 = w[n + 1]
                w2 = w[n + 2]
                w3 = w[n + 3]
                s00 = s01 = s02 = s03 = z
                for q in range(k):
                    x0 = a0[q]
                    s00 += x0 * w0[q]
                    s01 += x0 * w1[q]
                    s02 += x0 * w2[q]
                    s03 += x0 * w3[q]
                out[i, n] = s00
                out[i, n + 1] = s01
                out[i, n + 2] = s02
                out[i, n + 3] = s03
                n += 4
            while n < n1:
                wr = w[n]
                s0 = z
                for q in range(k):
                    s0 += a0[q] * wr[q]
                out[i, n] = s0
                n += 1
            i += 1


# reassoc: the sums vectorise along K; contract: multiply-adds. No nnan/ninf: NaN and
# infinity propagate as in BLAS.
_loop = jit.lazy(_rows_nk, fastmath={"reassoc", "contract"})
