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


class ShiftedWeights:
    """A constant 8-bit operand minus its zero point, kept per float dtype.

    ``exact`` holds the shifted values in float64 (exact) and ``l1`` the largest L1 norm
    that ``bound`` multiplies by max|a|; ``as_(dt)`` converts (and keeps) the operand in
    ``dt`` the first time a run needs it.
    """

    def __init__(self, shifted: np.ndarray, l1: int) -> None:
        self.exact = np.ascontiguousarray(shifted, dtype=np.float64)
        self.l1 = l1
        self._by_dtype: dict = {np.dtype(np.float64): self.exact}

    def as_(self, dt: np.dtype) -> np.ndarray:
        got = self._by_dtype.get(dt)
        if got is None:
            got = self._by_dtype[dt] = np.ascontiguousarray(self.exact.astype(dt))
        return got
