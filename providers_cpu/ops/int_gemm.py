"""Exact 8-bit integer products on float BLAS, for MatMulInteger, ConvInteger and kin.

NumPy's integer matmul is a plain loop (no BLAS): a [24, 1024] x [1024, 8210] uint8
product took 240 ms where sgemm takes a few. Integer operands are converted to float
and multiplied by BLAS instead, which gives the integer result bit for bit under one
condition, checked per call:

    Every operand is an integer (8-bit values minus an 8-bit zero point). Each output
    element is a sum of products a_k * b_k; whatever order BLAS adds them in (blocking,
    FMA, several threads), every product and every partial sum is a sub-sum of the
    same terms, so its magnitude is at most S = sum_k |a_k| * |b_k|, and
    S <= max|a| * (the largest sum_k |b_k| over B's columns). Integers up to 2^24
    (float32's 24-bit significand) or 2^53 (float64) are represented exactly, so if S
    is at most that, every product and every addition is exact and the result is the
    integer sum, whatever the order.

``bound`` is that S from max|a| and the largest column L1 norm of B (computed once
for constant weights); ``compute_dtype`` picks float32 when S <= 2^24, else float64.
The int32 result wraps on overflow as an int32 accumulator does (the integer kernels'
behaviour): from float64 through int64, exact below 2^53. Past 2^53 (K above 10^11,
which no memory holds) the product runs in int64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument

from . import vnni_gemm
from .op_mat_mul import matmul_2d

F32_EXACT = 1 << 24
F64_EXACT = 1 << 53
_I32_MAX = (1 << 31) - 1


def int_range(dt: Any) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dt))
    return int(info.min), int(info.max)


def shifted_max(dt: Any, zp: Any) -> int:
    """The largest |x - zp| over every value x of integer type ``dt`` (``zp`` may be an array).

    It needs no pass over the data: a zero point's distance to the type's ends.
    """
    lo, hi = int_range(dt)
    if zp is None:
        return max(-lo, hi)
    z = np.asarray(zp).astype(np.int64)
    if z.size == 0:
        return max(-lo, hi)
    return int(max(int(z.max()) - lo, hi - int(z.min())))


def data_max(x: np.ndarray, zp: Any) -> int:
    """max |x - zp| over ``x``'s actual values (one pass), for a tighter bound."""
    if x.size == 0:
        return 0
    z = np.asarray(0 if zp is None else zp).astype(np.int64)
    return int(max(int(x.max()) - int(z.min()), int(z.max()) - int(x.min()), 0))


def column_l1(b: np.ndarray) -> int:
    """The largest sum of |b| over the contracted (second-last) axis: max over columns."""
    if b.size == 0:
        return 0
    return int(np.abs(b.astype(np.int64)).sum(axis=-2).max())


def row_l1(w: np.ndarray) -> int:
    """The largest sum of |w| over each output channel (all axes but the first)."""
    if w.size == 0:
        return 0
    return int(np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1).max())


def compute_dtype(bound: int) -> np.dtype | None:
    """float32 or float64, whichever holds every partial sum up to ``bound`` exactly
    (float32 first: sgemm is about twice dgemm); None past float64."""
    if bound <= F32_EXACT:
        return np.dtype(np.float32)
    if bound <= F64_EXACT:
        return np.dtype(np.float64)
    return None


def to_int32(y: np.ndarray, bound: int) -> np.ndarray:
    """An exact integer-valued float (or int64) result as int32, wrapping as int32 sums do."""
    if bound <= _I32_MAX:
        return y.astype(np.int32)
    return y.astype(np.int64).astype(np.int32)


def narrow(shifted: np.ndarray) -> np.ndarray:
    """Shifted integer weights in int16 when they fit (8-bit values minus an 8-bit zero
    point always do), else int64: the exact copy a session keeps beside the float one."""
    if shifted.size == 0 or (int(shifted.min()) >= -(1 << 15) and int(shifted.max()) < 1 << 15):
        return np.ascontiguousarray(shifted, dtype=np.int16)
    return np.ascontiguousarray(shifted, dtype=np.int64)


class ShiftedWeights:
    """A constant 8-bit operand minus its zero point, kept per float dtype.

    ``exact`` holds the shifted values as integers (:func:`narrow`) and ``l1`` the largest
    L1 norm that ``bound`` multiplies by max|a|; ``as_(dt)`` converts (and keeps) the
    operand in ``dt`` the first time a run needs it.
    """

    def __init__(self, shifted: np.ndarray, l1: int, raw: Any = None) -> None:
        self.exact = narrow(shifted)
        self.l1 = l1
        self._by_dtype: dict = {}
        # (B, zero point) as given, for the VNNI tiles' packing of a 2-D 8-bit B
        self._raw = raw
        self._packed: Any = None

    def packed(self) -> vnni_gemm.PackedB | None:
        """B packed for the VNNI tiles (made on first use), or None where they cannot run."""
        if self._packed is None:
            b, zp = self._raw if self._raw is not None else (None, None)
            if b is None or b.ndim != 2 or not vnni_gemm.available(b.dtype):
                self._packed = False
            else:
                self._packed = vnni_gemm.PackedB(b, zp)
        return self._packed or None

    def as_(self, dt: np.dtype) -> np.ndarray:
        got = self._by_dtype.get(dt)
        if got is None:
            got = self._by_dtype[dt] = np.ascontiguousarray(self.exact.astype(dt))
        return got


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
        f"{op}: a_zero_point must have 1 element or one per row of A "
        f"(M={a.shape[-2] if a.ndim >= 2 else 1}), "
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
    packed = b.packed() if a.ndim >= 2 and vnni_gemm.available(a.dtype) else None
    if packed is not None:
        return vnni_gemm.matmul(a, za, packed)
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


def scaled_matmul(
    a: np.ndarray, a_zp: Any, b: ShiftedWeights, op: str, mult: Any, bias: Any
) -> np.ndarray:
    """``float32(exact_matmul(a, a_zp, b)) * mult (+ bias)`` in float32: the scale (per tensor
    or per column) and a per-column bias applied as each result is made, on the VNNI
    tiles; the same float32 operations afterwards elsewhere."""
    za = _a_zero_point(a, a_zp, op)
    packed = b.packed() if a.ndim >= 2 and vnni_gemm.available(a.dtype) else None
    mult = np.asarray(mult, np.float32)
    n = b.exact.shape[-1]
    fold_bias = bias is None or np.shape(bias) in ((n,), (1, n))
    if packed is not None and mult.size in (1, n) and mult.ndim <= 1 and fold_bias:
        mv = np.ascontiguousarray(np.broadcast_to(mult.reshape(-1), (n,)))
        bv = None if bias is None else np.ascontiguousarray(np.asarray(bias, np.float32).reshape(n))
        return vnni_gemm.matmul(a, za, packed, mv, bv)
    y = exact_matmul(a, a_zp, b, op).astype(np.float32) * mult
    if bias is not None:
        y = y + np.asarray(bias).astype(np.float32)
    return y


def shifted_b(b: np.ndarray, zp: Any, op: str, keep_raw: bool = False) -> ShiftedWeights:
    """B minus its zero point, measured; ``keep_raw`` (a constant B) keeps B as given too,
    for the VNNI tiles' packing."""
    s = shift_b(b, zp, op)
    return ShiftedWeights(s, column_l1(s), (b, zp) if keep_raw else None)


def constant_b(node: Any, b: int, zp: int, zp_of: Any = None) -> ShiftedWeights | None:
    """Input ``b`` minus input ``zp`` (its zero point), shifted and measured once, when both
    are constants (or the zero point is omitted); ``zp_of(zp)`` validates the zero point."""
    b_const = node.const_input(b)
    has_zp = node.has_input(zp)
    zp_const = node.const_input(zp) if has_zp else None
    if b_const is None or (has_zp and zp_const is None):
        return None
    if zp_of is not None and zp_const is not None:
        zp_const = zp_of(np.asarray(b_const), zp_const)
    return shifted_b(np.asarray(b_const), zp_const, node.op_type, keep_raw=True)
