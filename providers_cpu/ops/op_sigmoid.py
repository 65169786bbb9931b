"""Sigmoid on the CPU: float32 through the compiled logistic (``logistic.py``), float64 (or
numba off) in three in-place NumPy passes over one buffer.

exp(-x) overflows to inf for very negative x, and 1 / (1 + inf) is the right 0; NumPy
would warn about it, so the warning is silenced rather than avoided with the generic
kernel's extra abs/where passes.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import direct, kernel
from onnxep.providers.ops.elementwise import HALF_FLOATS
from onnxep.providers.ops.op_sigmoid import sigmoid as generic

from .logistic import sigmoid as sigmoid_values

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


@kernel("Sigmoid", since=(1, 6, 13))
def sigmoid(node, xp):
    general = generic(node, xp)

    def run(x):
        if x.dtype not in _FAST:
            return general(x)
        return (sigmoid_values(x),)

    return direct(run, sigmoid_values, HALF_FLOATS)
