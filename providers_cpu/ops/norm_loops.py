"""The compiled loop of LayerNormalization over the last axis (op_layer_normalization.py).

Imported only once ``jit.ENABLED`` has said numba is there and wanted. NumPy's path is
eight whole-array calls, whose ``mean`` over short rows runs a reduction loop per row:
on [120, 120] about 50 us where one pass per row in cache is a few. Two passes over
each row (the mean, then the deviations' squares), then the normalised row written with
its scale and bias; float32 sums (``reassoc`` lets them vectorise, so their order is
LLVM's, not NumPy's pairwise one: tolerance-level against the NumPy path).
"""

from __future__ import annotations

import numpy as np

from .. import jit

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.norm_loops needs numba (see providers_cpu/jit.py)")
nb = jit.nb


@nb.njit(cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})
def layer_norm_rows(x, scale, bias, eps, out):
    """``out[r] = (x[r] - mean) / sqrt(var + eps) * scale (+ bias)`` for each row of the
    2-D ``x``; ``bias`` empty when absent."""
    rows, d = x.shape
    biased = bias.shape[0] > 0
    inv_d = np.float32(1.0) / np.float32(d)
    one = np.float32(1.0)
    for r in range(rows):
        xr, o = x[r], out[r]
        s = np.float32(0.0)
        for k in range(d):
            s += xr[k]
        mean = s * inv_d
        q = np.float32(0.0)
        for k in range(d):
            c = xr[k] - mean
            q += c * c
        inv = one / np.sqrt(q * inv_d + eps)
        if biased:
            for k in range(d):
                o[k] = (xr[k] - mean) * inv * scale[k] + bias[k]
        else:
            for k in range(d):
                o[k] = (xr[k] - mean) * inv * scale[k]
