"""com.microsoft QLinearMul: the product of the dequantized inputs, requantized to C's.

As onnxruntime evaluates it: the integer product ``(a - a_zp) * (b - b_zp)`` times one
float32 ratio ``a_scale * b_scale / c_scale``, rounded half to even, plus ``c_zp``,
saturated (so a huge b_scale times a zero a gives 0, not NaN).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from ._qlinear import binary_kernel, requantize


def _mul(a, sa, za, b, sb, zb, sc, zc, dt):
    acc = (a.astype(np.int32) - np.int32(za)) * (b.astype(np.int32) - np.int32(zb))
    ratio = np.float32(np.float32(sa) * np.float32(sb)) / np.float32(sc)
    return requantize(acc, ratio, zc, np.dtype(dt))


@kernel(
    "QLinearMul",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("uint8", "int8"), 3: ("uint8", "int8")},
)
def q_linear_mul(node: Any, xp: Any):
    return binary_kernel(node, _mul)
