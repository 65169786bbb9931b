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

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel

from .int_gemm import (
    F32_EXACT,
    ShiftedWeights,
    column_l1,
    compute_dtype,
    data_max,
    shifted_max,
    to_int32,
)
from .op_mat_mul import matmul_2d


def _a_zero_point(a: np.ndarray, zp: Any, op: str) -> Any:
    """A's zero point shaped to broadcast: per tensor, or per row (length M)."""
    if zp is None:
        return None
    z = np.asarray(zp).astype(np.int64)
    if z.size == 1:
        return z.reshape(())
    if z.ndim == 1 and a.ndim >= 1 and (a.ndim == 1 or z.shape[0] == a.shape[-2]):
        return z.reshape(-1, 1)
    raise InvalidArgument(
        f"{op}: a_zero_point must have 1 element or one per row of A (M={a.shape[-2]}), "
        f"got shape {tuple(z.shape)}"
    )


def shift_b(b: np.ndarray, zp: Any, op: str) -> np.ndarray:
    """B minus its zero point (per tensor, or per column on the last axis) in int64."""
    bi = b.astype(np.int64)
    if zp is None:
        return bi
    z = np.asarray(zp).astype(np.int64)
    if z.size != 1 and (z.ndim < 1 or z.shape[-1] != b.shape[-1]):
        raise InvalidArgument(
            f"{op}: b_zero_point must have 1 element or one per column of B "
            f"(N={b.shape[-1]}), got shape {tuple(z.shape)}"
        )
    try:
        return bi - (z.reshape(()) if z.size == 1 else z)
    except ValueError:
        raise InvalidArgument(
            f"{op}: b_zero_point of shape {tuple(z.shape)} does not broadcast against B "
            f"{tuple(b.shape)}"
        ) from None


def exact_matmul(a: np.ndarray, a_zp: Any, b: ShiftedWeights, op: str) -> np.ndarray:
    """``(a - a_zp) @ b`` as int32, exactly, for 8-bit ``a`` and a shifted ``b``."""
    za = _a_zero_point(a, a_zp, op)
    bound = shifted_max(a.dtype, za) * b.l1
    if bound > F32_EXACT:
        # The type's range says float64; the data may still fit float32.
        bound = data_max(a, za) * b.l1
    cdt = compute_dtype(bound)
    if cdt is None:
        ai = a.astype(np.int64) - (0 if za is None else za)
        return to_int32(np.matmul(ai, b.exact.astype(np.int64)), bound)
    af = a.astype(cdt)
    if za is not None:
        af -= za.astype(cdt)
    bf = b.as_(cdt)
    y = matmul_2d(af, bf) if bf.ndim == 2 else np.matmul(af, bf)
    return to_int32(y, bound)


def shifted_b(b: np.ndarray, zp: Any, op: str) -> ShiftedWeights:
    s = shift_b(b, zp, op)
    return ShiftedWeights(s, column_l1(s))


@kernel("MatMulInteger", since=10)
def mat_mul_integer(node: Any, xp: Any):
    op = node.op_type
    b_const = node.const_input(1)
    zp_const = node.const_input(3) if node.has_input(3) else None
    fixed = None
    if b_const is not None and (zp_const is not None or not node.has_input(3)):
        fixed = shifted_b(np.asarray(b_const), zp_const, op)

    def run(a, b, a_zero_point=None, b_zero_point=None):
        wb = fixed if fixed is not None else shifted_b(b, b_zero_point, op)
        return (exact_matmul(a, a_zero_point, wb, op),)

    return run
