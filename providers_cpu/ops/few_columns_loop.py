"""The compiled loop of ``few_columns`` (imported only once ``jit.ENABLED`` has said numba is
there)."""

from __future__ import annotations

import numpy as np

from .. import jit
from .recurrent_loops import matvec

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.few_columns_loop needs numba (see providers_cpu/jit.py)")
nb = jit.nb


@nb.njit(cache=True, nogil=True, boundscheck=False)
def few_columns(w, cols, out):
    """out[j, i] = w[j] . cols[:, i]: the columns copied into rows, matvec, transposed back."""
    K, n = cols.shape
    M = w.shape[0]
    rows = np.empty((n, K), np.float32)
    for k in range(K):
        for i in range(n):
            rows[i, k] = cols[k, i]
    g = np.empty((n, M), np.float32)
    matvec(w, 0, M, rows, n, g)
    for j in range(M):
        for i in range(n):
            out[j, i] = g[i, j]
