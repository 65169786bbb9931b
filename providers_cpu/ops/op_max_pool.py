"""MaxPool on NumPy: dense separable running max over the flat padded input.

2-D float32/float64 pools with numba run one compiled loop per plane instead
(``jit._max_pool_2d``: no padded copy, one reduction per output row; YOLO's 5x5
stride-1 SPPF pools were 10x onnxruntime's time). The Indices output, and
integer/bool inputs, go through the generic kernel.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import PoolSpec, lowest
from onnxep.providers.ops.op_max_pool import max_pool as generic_max_pool

from .. import jit
from .nn_cpu import pad_input, parallel_rows, window_reduce

_COMPILED = (np.dtype(np.float32), np.dtype(np.float64))


def max_pool_2d(x, kernel, strides, dilations, pb, out) -> np.ndarray:
    """(N, C, H, W) -> (N, C, *out) through the compiled loop (``jit.ENABLED`` only)."""
    n, c, h, w = x.shape
    xc = np.ascontiguousarray(x).reshape(n * c, h, w)
    y = np.empty((n * c, *out), x.dtype)
    geo = (*kernel, *strides, *dilations, *pb)
    low = x.dtype.type(lowest(x.dtype))
    f = jit.loop("max_pool_2d")
    work = y.size * kernel[0] * kernel[1]
    parallel_rows(n * c, work, lambda r0, r1: f(xc, geo, low, r0, r1, y))
    return y.reshape(n, c, *out)


@kernel("MaxPool", since=(1, 8, 10, 11, 12, 22))
def max_pool(node, xp):
    if node.has_output(1):
        return generic_max_pool(node, xp)
    spec = PoolSpec(node)

    def run(x):
        pb, pe, out, _ = spec.geometry(x.shape[2:])
        if x.dtype.kind not in "fiu" or not x.dtype.isnative:
            # ml_dtypes floats (bfloat16, float8) have no fast np.maximum loop; upcast.
            y = run(x.astype(np.float32))[0]
            return (y.astype(x.dtype),)
        if len(out) == 2 and x.dtype in _COMPILED and x.size and jit.ENABLED:
            return (max_pool_2d(x, spec.kernel, spec.strides, spec.dilations, pb, out),)
        xpad = pad_input(x, pb, pe, lowest(x.dtype))
        return (window_reduce(xpad, spec.kernel, spec.strides, spec.dilations, out, np.maximum),)

    return run
