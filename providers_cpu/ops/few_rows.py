"""Matrix products of one to three rows as one GEMV a row.

OpenBLAS's SGEMM packs all of B on every call, and its kernels are at their worst for
2, 3, 5 or 6 rows: [2, 4096] x [4096, 400] took 281-297 us on one thread against two
GEMVs of 74 us; at 4 and 8 rows its kernels fit and SGEMM is as fast or faster
(docs/cpu_kernels.md, "Products of a few rows"). NumPy calls a GEMV itself for one row.
The rule is by shape alone, so a kernel gives the same bits whether its weight is a
constant or fed; they differ from SGEMM's in the last place (another order of additions).
"""

from __future__ import annotations

import numpy as np

#: A with at most this many rows runs one GEMV a row, when the weight has at least
#: MIN_SIZE elements (below, one SGEMM call costs less than the calls)
ROWS = 3
MIN_SIZE = 32768
_BLAS = (np.dtype(np.float32), np.dtype(np.float64))


def fits(a: np.ndarray, w: np.ndarray, k_axis: int) -> bool:
    """2-D ``a`` of at most ROWS rows against 2-D ``w`` whose axis ``k_axis`` is a's K,
    both of one BLAS dtype, ``w`` not tiny."""
    return (
        a.ndim == 2
        and w.ndim == 2
        and 0 < a.shape[0] <= ROWS
        and w.size >= MIN_SIZE
        and a.shape[1] == w.shape[k_axis]
        and a.dtype == w.dtype
        and w.dtype in _BLAS
    )


def rows_times_transposed(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w.T`` for ``w`` [N, K] C-contiguous: ``w @ a[i]`` a row."""
    y = np.empty((a.shape[0], w.shape[0]), w.dtype)
    for i in range(a.shape[0]):
        np.matmul(w, a[i], out=y[i])
    return y


def rows_times(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for ``b`` [K, N]: ``a[i] @ b`` a row."""
    y = np.empty((a.shape[0], b.shape[1]), b.dtype)
    for i in range(a.shape[0]):
        np.matmul(a[i], b, out=y[i])
    return y
