"""LpNormalization on NumPy: float32 over the last axis in one compiled pass (norms_jit).

The generic kernel's six NumPy calls (square, sum, sqrt, two wheres, divide) cost 22 us a
node on a decoder's one-row q/k normalizations; other axes, dtypes, strides, or numba
off, run it.
"""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_lp_normalization import lp_normalization as generic

from . import norms_jit


@kernel("LpNormalization", since=(1, 22))
def lp_normalization(node, xp):
    general = generic(node, xp)
    axis = int(node.attr("axis", -1))
    p = int(node.attr("p", 2))
    if not norms_jit.enabled():
        return general

    def run(x):
        if (axis == -1 or axis == x.ndim - 1) and x.ndim and norms_jit.rows_ok(x):
            return (norms_jit.lp_last(x, p),)
        return general(x)

    return run
