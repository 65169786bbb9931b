"""com.microsoft DynamicQuantizeMatMul: float A quantized to uint8 on the fly, times 8-bit B.

A's scale and zero point come from its range widened to include 0, as
DynamicQuantizeLinear's (an all-zero A gets scale 1); then
``((qA - a_zp) @ (B - b_zp)) * (a_scale * b_scale) + bias``, B's parameters per tensor or
per column. onnxruntime's DynamicQuantizeLinear + MatMulInteger + Mul fusion emits it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from .qlinear import dynamic_uint8, integer_matmul_to_float, packed_b, per_column


@kernel(
    "DynamicQuantizeMatMul",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float",), 1: ("uint8", "int8")},
)
def dynamic_quantize_matmul(node: Any, xp: Any):
    op = node.op_type
    packed = packed_b(node, 1, 3)

    def run(a, b, b_scale, b_zp=None, bias=None):
        qa, a_scale, a_zp = dynamic_uint8(a.astype(np.float32, copy=False))
        mult = a_scale * per_column(b_scale, b.shape[-1], op, "b_scale").astype(np.float32)
        return (integer_matmul_to_float(qa, a_zp, b, b_zp, mult, bias, op, packed),)

    return run
