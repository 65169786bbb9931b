"""PRelu on NumPy without ``where`` where the slopes allow (op_leaky_relu.py says why):
with every slope <= 1 it is max(x, slope * x), with every slope >= 1 min(x, slope * x),
exactly; mixed, zero or infinite slopes (where slope * x can be NaN for an infinite x)
take the generic kernel. The slopes are few (one per channel), so
the check costs little and is made once for a constant slope."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_p_relu import p_relu as generic

from .ufuncs import BLAS_FLOATS


def _pick(slope: np.ndarray):
    if not slope.size or not bool(np.isfinite(slope).all()) or not bool(slope.all()):
        return None
    if bool((slope <= 1).all()):
        return np.maximum
    if bool((slope >= 1).all()):
        return np.minimum
    return None


@kernel("PRelu", since=(1, 6, 7, 9, 16))
def p_relu(node, xp):
    general = generic(node, xp)
    legacy = node.opset < 7
    const = node.const_input(1)
    fixed = _pick(np.asarray(const)) if isinstance(const, np.ndarray) else None

    def run(x, slope):
        if (
            legacy
            or x.dtype not in BLAS_FLOATS
            or slope.dtype != x.dtype
            or np.broadcast_shapes(x.shape, slope.shape) != x.shape
        ):
            return general(x, slope)
        pick = fixed if slope is const else _pick(slope)
        if pick is None:
            return general(x, slope)
        y = np.multiply(x, slope)
        return (pick(x, y, out=y) if y.ndim else np.asarray(pick(x, y)),)

    return run
