"""onnxep::SiLU on the CPU: x * Sigmoid(x) in one pass (``logistic.py``).

The fusion (``fuse_silu``) is exact: this is the CPU provider's Sigmoid (the same
compiled float32 loop, or for float64 / numba off its three NumPy passes) with the
product ``x * s`` written over ``s``, the very operations the two nodes ran, in one
buffer instead of two (a YOLO-style detector's SiLUs are most of its elementwise time on
the CPU).
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import direct, kernel
from onnxep.providers.ops.elementwise import HALF_FLOATS
from onnxep.providers.ops.fused import FLOATS
from onnxep.providers.ops.op_silu import silu as generic

from .logistic import logistic

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def _silu(x: np.ndarray) -> np.ndarray:
    return logistic(x, mul=True)


@kernel("SiLU", domain="onnxep", dtypes=FLOATS)
def silu(node, xp):
    general = generic(node, xp)

    def run(x):
        if x.dtype not in _FAST:
            return general(x)
        return (_silu(x),)

    return direct(run, _silu, HALF_FLOATS)
