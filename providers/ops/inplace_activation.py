"""The activations com.microsoft FusedConv and FusedGemm apply, in place on a fresh float output.

Written on the array API with ``out=``, so the CPU provider (NumPy) and the CUDA provider
(CuPy, capture-safe elementwise kernels) share one definition of each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any


def inplace_activation(
    xp: Any, name: str, params: Sequence[float] | None
) -> Callable[[Any], Any] | None:
    """``act(y)`` that overwrites the float array ``y``, or None for an unknown name."""
    p = [float(v) for v in (params or [])]
    if name == "Relu":
        return lambda y: xp.maximum(y, 0, out=y)
    if name == "LeakyRelu":
        a = p[0] if p else 0.01

        def leaky(y):
            y[...] = xp.where(y < 0, y * y.dtype.type(a), y)

        return leaky
    if name == "Sigmoid":

        def sigmoid(y):
            xp.negative(y, out=y)
            xp.exp(y, out=y)
            y += 1
            xp.reciprocal(y, out=y)

        return sigmoid
    if name == "Tanh":
        return lambda y: xp.tanh(y, out=y)
    if name == "Clip":
        lo = p[0] if len(p) > 0 else -math.inf
        hi = p[1] if len(p) > 1 else math.inf
        return lambda y: xp.clip(y, lo, hi, out=y)
    if name == "HardSigmoid":
        a = p[0] if len(p) > 0 else 0.2
        b = p[1] if len(p) > 1 else 0.5

        def hard_sigmoid(y):
            y *= a
            y += b
            xp.clip(y, 0, 1, out=y)

        return hard_sigmoid
    return None
