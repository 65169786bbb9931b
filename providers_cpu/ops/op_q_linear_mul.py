"""com.microsoft QLinearMul: the product of the dequantized inputs, requantized to C's."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from ._qlinear import binary_kernel, dequantize, quantize


def _mul(a, sa, za, b, sb, zb, sc, zc, dt):
    return quantize(dequantize(a, sa, za) * dequantize(b, sb, zb), sc, zc, np.dtype(dt))


@kernel(
    "QLinearMul",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("uint8", "int8"), 3: ("uint8", "int8")},
)
def q_linear_mul(node: Any, xp: Any):
    return binary_kernel(node, _mul)
