"""com.microsoft RotaryEmbedding on float32 in one compiled pass (numba): each row's
cache lookup, bounds check and rotation together.

The NumPy path (the ids' bounds check, two cache gathers, a complex buffer filled and
multiplied, four strided copies back) took 33 us a node for one decode token of 4 heads
on the 2-core Zen 3; onnxruntime's takes 9. Each rotated pair is the complex product
(x1 + i x2)(cos + i sin) = (x1 cos - x2 sin) + i (x1 sin + x2 cos), as ``rotate_into``'s
complex multiply computes it.
"""

from __future__ import annotations

import numpy as np

from .. import jit


def rotate(
    x4: np.ndarray,
    y4: np.ndarray,
    ids: np.ndarray,
    counted: bool,
    cos: np.ndarray,
    sin: np.ndarray,
    interleaved: bool,
    rot: int,
) -> bool:
    """Rotate ``x4`` (B, S, N, H) into ``y4`` (same shape, any strides) at the cache rows
    ``ids`` (B, S) int64, or ``ids[0, 0] + s`` when ``counted``; False (``y4`` partly
    written) when a row is outside the cache, for the caller's error."""
    return _loop()(x4, y4, ids, counted, cos, sin, interleaved, rot)


def _rotate_rows(x, y, ids, counted, cos, sin, interleaved, rot):
    b, s, n, h = x.shape
    rows = cos.shape[0]
    half = rot // 2
    for i in range(b):
        for t in range(s):
            r = ids[0, 0] + t if counted else ids[i, t]
            if r < 0 or r >= rows:
                return False
            for hd in range(n):
                for j in range(half):
                    if interleaved:
                        a = x[i, t, hd, 2 * j]
                        c = x[i, t, hd, 2 * j + 1]
                    else:
                        a = x[i, t, hd, j]
                        c = x[i, t, hd, half + j]
                    co = cos[r, j]
                    si = sin[r, j]
                    re = a * co - c * si
                    im = a * si + c * co
                    if interleaved:
                        y[i, t, hd, 2 * j] = re
                        y[i, t, hd, 2 * j + 1] = im
                    else:
                        y[i, t, hd, j] = re
                        y[i, t, hd, half + j] = im
                for j in range(rot, h):
                    y[i, t, hd, j] = x[i, t, hd, j]
    return True


_loop = jit.lazy(_rotate_rows)
