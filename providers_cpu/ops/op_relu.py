"""Relu on NumPy as clip(x, 0, inf) + 0 for float32/float64: ``np.maximum(x, 0)`` takes a
slow scalar loop in NumPy 2.4 (188 us against 67 on a 640k-element map, ufuncs.py). The
same bits: clip keeps an input -0 where ``maximum`` gives +0, and adding +0 turns -0 into
+0 and changes nothing else (NaN stays NaN). Up to ``SMALL`` values (a VAD decoder's
[1, 128, 1]) it is one ``np.maximum`` against a zero of the input's type, which gives those
bits too (tested) and costs one ufunc call instead of two (FusedConv's short-signal Relu,
``conv_epilogue.Epilogue.inplace``, does the same)."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import direct, kernel
from onnxep.providers.ops.op_relu import relu as generic

from .ufuncs import BLAS_FLOATS, OTHER_DTYPES, clip_ufunc

#: up to this many values the slow ``maximum`` loop costs less than a second ufunc call
SMALL = 1024
#: 0-d arrays, not NumPy scalars: ``maximum`` converts a scalar operand to an array on every
#: call (0.2 us of a 0.5 us node)
_ZEROS = {np.dtype(t): np.zeros((), t) for t in (np.float32, np.float64)}


def _relu(x: np.ndarray) -> np.ndarray:
    if x.size <= SMALL and x.ndim:
        return np.maximum(x, _ZEROS[x.dtype])
    y = clip_ufunc(x, 0, np.inf)
    if y.ndim:
        y += 0.0
        return y
    return y + 0.0


@kernel("Relu", since=(1, 6, 13, 14))
def relu(node, xp):
    general = generic(node, xp)

    def run(x):
        if x.dtype not in BLAS_FLOATS:
            return general(x)
        return (np.asarray(_relu(x)),)

    return direct(run, _relu, OTHER_DTYPES)
