"""Sigmoid on NumPy: three in-place ufunc passes over one buffer.

exp(-x) overflows to inf for very negative x, and 1 / (1 + inf) is the right
0; NumPy would warn about it, so the warning is silenced rather than avoided
with the generic kernel's extra abs/where passes.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_sigmoid import sigmoid as generic

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


@kernel("Sigmoid", since=(1, 6, 13))
def sigmoid(node, xp):
    general = generic(node, xp)

    def run(x):
        if x.dtype not in _FAST:
            return general(x)
        # out= keeps a 0-d input an array: a plain ufunc call returns a NumPy scalar there.
        t = np.negative(x, out=np.empty(x.shape, x.dtype))
        with np.errstate(over="ignore"):
            np.exp(t, out=t)
        t += 1
        np.reciprocal(t, out=t)
        return (t,)

    return run
