"""RMSNormalization (opset 23) on NumPy: float32 in a few in-place passes (``rms_scaled``).

The normalized axes (``axis`` to the end) are flattened into one, so any ``axis`` with a
scale of the normalized shape takes the fast path; other dtypes, a ``stash_type`` other
than float32 and broadcast scales go to the generic kernel.
"""

from __future__ import annotations

import math

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_rms_normalization import rms_normalization as generic

from .rms_cpu import fast_ok, rms_scaled


@kernel("RMSNormalization", since=23)
def rms_normalization(node, xp):
    general = generic(node, xp)
    axis = int(node.attr("axis", -1))
    eps = float(node.attr("epsilon", 1e-5))
    if int(node.attr("stash_type", 1)) != 1:
        return general

    def run(x, scale):
        a = axis + x.ndim if axis < 0 else axis
        if not 0 <= a < x.ndim or tuple(scale.shape) != x.shape[a:]:
            return general(x, scale)
        n = math.prod(x.shape[a:])
        x2, w = x.reshape(-1, n), scale.reshape(n)
        if not fast_ok(x2, w):
            return general(x, scale)
        return (rms_scaled(x2, w, eps).reshape(x.shape),)

    return run
