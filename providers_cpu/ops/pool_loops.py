"""The compiled loop of AveragePool over disjoint 2-D windows (op_average_pool.py).

Imported only once ``jit.ENABLED`` has said numba is there and wanted. Windows as
large as their strides, with no padding, tile the input: every window is full and
its divisor the window's size. The general path (``nn_cpu.window_reduce``: a compiled
pass down the rows, one strided NumPy call per window column, then the divisor map's
multiply, five calls and two temporaries) took 84-100 us on a text recogniser's
[1, 480, 6, 40] with 3x2 windows against onnxruntime's 8-20. One pass here, its sums in
the general path's order (each window column down its rows, then the columns left to
right) and the same float32 multiply by the reciprocal, so the same bits.
"""

from __future__ import annotations

import numpy as np

from .. import jit

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.pool_loops needs numba (see providers_cpu/jit.py)")
nb = jit.nb


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def average_disjoint(x, kh, kw, inv, out):
    """out[p, i, j] = (sum over the kh x kw window at (i kh, j kw) of x[p]) * inv, for
    planes ``x`` (P, H, W) and ``out`` (P, H // kh, W // kw). A window row's columns are
    summed down its kh rows for the whole row at once (a contiguous, vectorised pass),
    then each window adds its kw column sums."""
    n_p, oh, ow = out.shape
    width = ow * kw
    col = np.empty(width, x.dtype)
    for p in range(n_p):
        xp, op = x[p], out[p]
        for i in range(oh):
            r0 = i * kh
            first = xp[r0]
            for w in range(width):
                col[w] = first[w]
            for t in range(1, kh):
                row = xp[r0 + t]
                for w in range(width):
                    col[w] = col[w] + row[w]
            o = op[i]
            for j in range(ow):
                c0 = j * kw
                total = col[c0]
                for u in range(1, kw):
                    total = total + col[c0 + u]
                o[j] = total * inv
