"""The compiled loop of ``conv_short`` (imported only once ``jit.ENABLED`` has said numba is
there)."""

from __future__ import annotations

import numpy as np

from .. import jit
from .recurrent_loops import matvec

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.conv_short_loop needs numba (see providers_cpu/jit.py)")
nb = jit.nb


@nb.njit(cache=True, nogil=True, boundscheck=False)
def conv_short(x, w, k, stride, dil, pb, relu, y):
    """y[n, m, o] = w[m] . (x[n]'s window at o, then 1) for a 1-D conv, per image.

    ``x`` (N, C, Lin) C-contiguous float32, ``w`` (M, C * k + 1) with the bias last, ``y``
    (N, M, L). Each image's windows are copied into rows (zeros where the window leaves
    the signal: the padding), then ``matvec``: the rows few_columns builds from the
    im2col columns, so the same sums. ``relu``: max(v, 0) as stored (NaN stays NaN, -0
    becomes +0: the Relu kernel's bits).
    """
    n_img, c_in, l_in = x.shape
    m_out = w.shape[0]
    length = y.shape[2]
    ck = c_in * k
    rows = np.empty((length, ck + 1), np.float32)
    g = np.empty((length, m_out), np.float32)
    for n in range(n_img):
        for o in range(length):
            base = o * stride - pb
            row = rows[o]
            for c in range(c_in):
                xc = x[n, c]
                for kk in range(k):
                    pos = base + kk * dil
                    row[c * k + kk] = xc[pos] if 0 <= pos < l_in else np.float32(0.0)
            row[ck] = np.float32(1.0)
        matvec(w, 0, m_out, rows, length, g)
        yn = y[n]
        for m in range(m_out):
            for o in range(length):
                v = g[o, m]
                if relu and v <= 0:
                    v = np.float32(0.0)
                yn[m, o] = v
