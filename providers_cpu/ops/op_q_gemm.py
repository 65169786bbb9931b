"""com.microsoft QGemm: 8-bit Gemm with an int32 bias, requantized or scaled to float.

As onnxruntime: ``acc = C + (A' - a_zp) @ (B' - b_zp)`` in int32 (A', B' transposed as
transA/transB say; C broadcasts as Gemm's; the product is int_gemm's exact one on float
BLAS, a constant B shifted once), then ``acc * alpha * a_scale * b_scale``,
divided by ``y_scale`` when given; with ``y_zero_point`` it is rounded half to even and
saturated to Y's type, without it Y is float. B's parameters are per tensor or per column.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel

from .int_gemm import exact_matmul, shifted_b
from .qlinear import per_column, requantize, scalar


@kernel(
    "QGemm", since=1, domain="com.microsoft", dtypes={0: ("uint8", "int8"), 3: ("uint8", "int8")}
)
def q_gemm(node: Any, xp: Any):
    op = node.op_type
    alpha = np.float32(node.attr("alpha", 1.0))
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    out_dt = node.input_dtype(8) if node.has_input(8) else None
    b_const, zp_const = node.const_input(3), node.const_input(5)
    packed = None
    if b_const is not None and zp_const is not None and np.ndim(b_const) == 2:
        bt = np.asarray(b_const).T if trans_b else np.asarray(b_const)
        packed = shifted_b(bt, per_column(zp_const, bt.shape[1], op, "b_zero_point"), op)

    def run(a, a_scale, a_zp, b, b_scale, b_zp, c=None, y_scale=None, y_zp=None):
        if a.ndim != 2 or b.ndim != 2:
            raise InvalidArgument(f"{op}: A and B must be 2-D, got {a.shape} and {b.shape}")
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        if a.shape[1] != b.shape[0]:
            raise InvalidArgument(f"{op}: A' {a.shape} and B' {b.shape} do not multiply")
        n = b.shape[1]
        wb = packed
        if wb is None:
            wb = shifted_b(b, per_column(b_zp, n, op, "b_zero_point"), op)
        acc = exact_matmul(a, np.int32(scalar(a_zp, op, "a_zero_point")), wb, op)
        if c is not None:
            acc = acc + c.astype(np.int32)
        scale = alpha * np.float32(scalar(a_scale, op, "a_scale"))
        scale = scale * per_column(b_scale, n, op, "b_scale").astype(np.float32)
        if y_scale is not None:
            scale = scale / np.float32(scalar(y_scale, op, "y_scale"))
        if y_zp is None:
            return (acc.astype(np.float32) * scale,)
        dt = np.dtype(out_dt or y_zp.dtype)
        return (requantize(acc, scale, int(scalar(y_zp, op, "y_zero_point")), dt),)

    return run
