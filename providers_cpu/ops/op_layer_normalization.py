"""LayerNormalization: float32 over the last axis in one compiled pass per row (numba,
norm_loops.py), else in a few in-place NumPy passes."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_layer_normalization import layer_normalization as generic

from .. import jit

_EMPTY = np.empty(0, np.float32)


# onnxruntime registers its own kernel in the default domain below opset 17 (the op was a
# contrib op there): same attributes and outputs, so one builder serves both.
@kernel("LayerNormalization", since=(1, 17))
def layer_normalization(node, xp):
    general = generic(node, xp)
    axis = int(node.attr("axis", -1))
    eps = np.float32(node.attr("epsilon", 1e-5))
    if node.has_output(1) or node.has_output(2) or int(node.attr("stash_type", 1)) != 1:
        return general

    def run(x, scale, bias=None):
        d = x.shape[-1] if x.ndim else 0
        if (
            x.dtype != np.float32
            or axis not in (-1, x.ndim - 1)
            or scale.shape != (d,)
            or scale.dtype != np.float32
            or (bias is not None and (bias.shape != (d,) or bias.dtype != np.float32))
        ):
            return general(x, scale, bias)
        if not x.size:  # no rows, or rows of nothing (whose mean is no number)
            return (np.empty(x.shape, np.float32),)
        if jit.ENABLED:
            from .norm_loops import layer_norm_rows

            x2 = np.ascontiguousarray(x).reshape(-1, d)
            out = np.empty(x.shape, np.float32)
            layer_norm_rows(x2, scale, _EMPTY if bias is None else bias, eps, out.reshape(-1, d))
            return (out,)
        c = x - x.mean(axis=-1, keepdims=True)
        var = np.einsum("...i,...i->...", c, c)[..., None]
        var *= np.float32(1.0 / d)
        var += eps
        np.sqrt(var, out=var)
        np.reciprocal(var, out=var)
        c *= var
        c *= scale
        if bias is not None:
            c += bias
        return (c,)

    return run
