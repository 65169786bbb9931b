"""onnxep::SiLU on NumPy: the CPU Sigmoid's three in-place passes, then the product in place.

The fusion (``fuse_silu``) is exact: this is the CPU provider's Sigmoid kernel
(``op_sigmoid``) followed by ``x * s`` written over ``s``, the very operations the
two nodes ran, in one buffer instead of two (a YOLO-style detector's SiLUs are most
of its elementwise time on the CPU).
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import direct, kernel
from onnxep.providers.ops.elementwise import HALF_FLOATS
from onnxep.providers.ops.fused import FLOATS
from onnxep.providers.ops.op_silu import silu as generic

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def _silu(x: np.ndarray) -> np.ndarray:
    t = np.negative(x, out=np.empty(x.shape, x.dtype))
    with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x gives the right 0
        np.exp(t, out=t)
    t += 1
    np.reciprocal(t, out=t)
    np.multiply(x, t, out=t)
    return t


@kernel("SiLU", domain="onnxep", dtypes=FLOATS)
def silu(node, xp):
    general = generic(node, xp)

    def run(x):
        if x.dtype not in _FAST:
            return general(x)
        return (_silu(x),)

    return direct(run, _silu, HALF_FLOATS)
