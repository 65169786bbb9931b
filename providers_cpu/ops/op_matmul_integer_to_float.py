"""com.microsoft MatMulIntegerToFloat: an 8-bit MatMulInteger scaled back to float.

``((A - a_zp) @ (B - b_zp)) * (a_scale * b_scale) + bias``: A's parameters per tensor,
B's per tensor or per column. onnxruntime's MatMulInteger + Mul (+ Add) fusion emits it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from .qlinear import integer_matmul_to_float, packed_b, per_column, scalar


@kernel(
    "MatMulIntegerToFloat",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("uint8", "int8"), 1: ("uint8", "int8"), 2: ("float",)},
)
def matmul_integer_to_float(node: Any, xp: Any):
    op = node.op_type
    packed = packed_b(node, 1, 5)

    def run(a, b, a_scale, b_scale, a_zp=None, b_zp=None, bias=None):
        mult = np.float32(scalar(a_scale, op, "a_scale")) * per_column(
            b_scale, b.shape[-1], op, "b_scale"
        ).astype(np.float32)
        za = scalar(a_zp, op, "a_zero_point", 0)
        return (integer_matmul_to_float(a, za, b, b_zp, mult, bias, op, packed),)

    return run
