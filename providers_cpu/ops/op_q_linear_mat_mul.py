"""QLinearMatMul on NumPy: the generic kernel with int_gemm's exact int32 product.

The integer product is the one NumPy runs without BLAS; here it runs on float BLAS with
the same int32 result (int_gemm), and a constant B with a constant zero point is shifted
and converted once. The requantization after it is the generic kernel's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_q_linear_mat_mul import build_q_linear_mat_mul
from onnxep.providers.ops.quant import is_int_dtype

from .int_gemm import constant_b, exact_matmul, shifted_b


@kernel("QLinearMatMul", since=(10, 21))
def q_linear_mat_mul(node: Any, xp: Any):
    op = node.op_type
    bdt = node.input_dtype(3)
    fixed = constant_b(node, 3, 5) if bdt is not None and is_int_dtype(bdt) else None

    def product(a, a_zp, b, b_zp):
        wb = fixed if fixed is not None else shifted_b(b, np.asarray(b_zp), op)
        return exact_matmul(a, a_zp, wb, op)

    return build_q_linear_mat_mul(node, xp, product)
