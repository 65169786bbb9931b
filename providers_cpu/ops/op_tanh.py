"""Tanh on the CPU: float32 through ``tanh.py``'s compiled loop (no libm call per value),
everything else through NumPy's ufunc, as the generic kernel."""

from __future__ import annotations

from onnxep.providers.kernel import direct, kernel
from onnxep.providers.ops.elementwise import NARROW_FLOATS
from onnxep.providers.ops.op_tanh import tanh as generic

from .tanh import tanh as fast


@kernel("Tanh", since=(1, 6, 13))
def tanh(node, xp):
    general = generic(node, xp)

    def run(x):
        if x.dtype in NARROW_FLOATS:
            return general(x)
        return (fast(x),)

    return direct(run, fast, NARROW_FLOATS)
