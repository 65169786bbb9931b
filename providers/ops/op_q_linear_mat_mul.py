"""QLinearMatMul: quantized matrix product requantized to the output's scale and zero point."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import is_int_dtype, saturate_cast, to_float


def _row(p: Any) -> Any:
    # a's per-row parameters (length M) broadcast down the rows.
    return p.reshape(-1, 1) if p.ndim == 1 and p.shape[0] != 1 else p.reshape(())


def _col(p: Any) -> Any:
    return p if p.ndim == 1 and p.shape[0] != 1 else p.reshape(())


@kernel("QLinearMatMul", since=(10, 21))
def q_linear_mat_mul(node: NodeInfo, xp: Any):
    return build_q_linear_mat_mul(node, xp)


def build_q_linear_mat_mul(node: NodeInfo, xp: Any, integer_matmul: Any = None):
    """The QLinearMatMul runner; ``integer_matmul(a, a_zp, b, b_zp)``, when given, computes
    the int32 product of integer operands (the CPU provider's exact one on float BLAS) in
    place of the int32 matmul here."""
    out_dt = np.dtype(node.input_dtype(7) or np.uint8)
    adt, bdt = node.input_dtype(0), node.input_dtype(3)
    integer = all(d is not None and is_int_dtype(d) for d in (adt, bdt))

    def run(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
        if integer and integer_matmul is not None:
            acc = integer_matmul(a, a_zp, b, b_zp).astype(np.float32)
        else:
            if integer:
                av = a.astype(np.int32) - _row(a_zp.astype(np.int32))
                bv = b.astype(np.int32) - _col(b_zp.astype(np.int32))
            else:
                av = to_float(a, np.float32) - _row(to_float(a_zp, np.float32))
                bv = to_float(b, np.float32) - _col(to_float(b_zp, np.float32))
            acc = xp.matmul(av, bv).astype(np.float32)
        sa = _row(a_scale.astype(np.float32))
        sb = _col(b_scale.astype(np.float32))
        sy = y_scale.astype(np.float32).reshape(())
        v = acc * (sa * sb / sy)
        if is_int_dtype(out_dt):
            v = xp.round(v)
        v = v + to_float(y_zp, np.float32).reshape(())
        return (saturate_cast(v, out_dt, xp),)

    return run
