"""MatMulInteger on NumPy: the 8-bit product through float BLAS, exact (see int_gemm).

The generic kernel multiplies int32 arrays, which NumPy does without BLAS (240 ms for
ddddocr's [24, 1024] x [1024, 8210] classifier, against a few ms in sgemm). Here both
operands, minus their zero points, are converted to float32 when every partial sum is
provably below 2^24, else float64, and the integer result is the generic kernel's bit
for bit. A constant B (with a constant zero point) is shifted, measured and converted
once per session.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel

from .int_gemm import constant_b, exact_matmul, shifted_b


@kernel("MatMulInteger", since=10)
def mat_mul_integer(node: Any, xp: Any):
    op = node.op_type
    fixed = constant_b(node, 1, 3)

    def run(a, b, a_zero_point=None, b_zero_point=None):
        wb = fixed if fixed is not None else shifted_b(b, b_zero_point, op)
        return (exact_matmul(a, a_zero_point, wb, op),)

    return run
