"""8-bit products on the compiled AVX-512 VNNI tiles (``providers_cpu/jit_int8.py``).

The tiles multiply uint8 rows by int8 rows, 64 bytes at a time, into int32. Other
signs are moved there exactly: an int8 operand plus 128 is a uint8 one, a uint8
operand minus 128 an int8 one, and its zero point moves by the same 128, so
``(a - za) * (b - zb)`` is unchanged. Constant weights are packed once per session
(:class:`PackedB`): one int8 row per output column, zero-padded to a multiple of 64
bytes, with each row's sum for the zero-point correction. The result is the int32
accumulator's bit for bit, wrapping included (jit_int8 says why no bound is needed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import jit_int8
from .nn_cpu import parallel_rows

# Below this many multiply-adds (about 20 us on one core) a second thread costs more
# than it saves.
PARALLEL_WORK = 1 << 23
_EMPTY_I = np.empty((0, 0), np.int32)
_EMPTY_F = np.empty((0, 0), np.float32)
_NO_BIAS = np.empty(0, np.float32)


def padded(k: int) -> int:
    return -(-max(k, 1) // jit_int8.BLOCK) * jit_int8.BLOCK


def available(*dtypes: Any) -> bool:
    """Whether the tiles can run here on operands of these (8-bit) dtypes."""
    ok = all(np.dtype(d) in (np.dtype(np.uint8), np.dtype(np.int8)) for d in dtypes)
    return ok and jit_int8.vnni()


class PackedB:
    """Weights ``rows`` (N, K), one row per output column, as the tiles read them.

    ``zp`` is the weights' zero point: None, one value, or one per row (length N).
    """

    def __init__(self, rows: np.ndarray, zp: Any) -> None:
        n, k = rows.shape
        flip = rows.dtype == np.uint8
        b8 = (rows.astype(np.int16) - 128 if flip else rows).astype(np.int8)
        self.k = k
        self.b = np.zeros((n, padded(k)), np.int8)
        self.b[:, :k] = b8
        self.sb = b8.sum(axis=1, dtype=np.int64)
        z = np.zeros(n, np.int64) if zp is None else np.asarray(zp).astype(np.int64).reshape(-1)
        self.zb = np.ascontiguousarray(np.broadcast_to(z, (n,))) - (128 if flip else 0)

    @property
    def n(self) -> int:
        return self.b.shape[0]


def pack_a(a2: np.ndarray, k_padded: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(M, K) uint8 or int8 rows as (M, Kp) uint8 with their sums, and the shift (0 or 128)
    their zero point takes. A uint8 matrix already padded is used as it is."""
    m, k = a2.shape
    flip = 128 if a2.dtype == np.int8 else 0
    sums = np.empty(m, np.int32)
    if not flip and k == k_padded and a2.flags.c_contiguous:
        jit_int8.loop("row_sums")(a2, k, sums, 0, m)
        return a2, sums, 0
    buf = np.empty((m, k_padded), np.uint8)
    jit_int8.loop("pack_rows")(a2, flip, buf, sums)
    return buf, sums, flip


def gemm(
    a: np.ndarray,
    sa: np.ndarray,
    za: np.ndarray,
    packed: PackedB,
    out: np.ndarray,
    mult: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    m_range: tuple[int, int] | None = None,
) -> None:
    """``out[m, n] = sum_k (a[m, k] - za[m]) * (b[n, k] - zb[n])`` over ``packed``'s K.

    ``a`` is pack_a's buffer with its sums ``sa`` and zero points ``za`` (int64, one per
    row, shift included); ``out`` (M, N) int32, or float32 with ``mult`` (N float32) and
    optionally ``bias`` (N float32): ``float32(acc) * mult + bias``. Split over columns
    on the run's threads when large; ``m_range`` limits the rows (the caller splits).
    """
    f = jit_int8.loop("u8s8_gemm")
    m0, m1 = m_range or (0, a.shape[0])
    n = packed.n
    if mult is None:
        out_i, out_f, mv, bv = out, _EMPTY_F, _NO_BIAS, _NO_BIAS
    else:
        out_i, out_f, mv = _EMPTY_I, out, mult
        bv = _NO_BIAS if bias is None else bias
    args = (a, packed.b, packed.k, za, packed.zb, sa, packed.sb, mv, bv, out_i, out_f, m0, m1)
    work = (m1 - m0) * n * a.shape[1]
    if m_range is not None or work < PARALLEL_WORK:
        f(*args, 0, n)
        return
    # in groups of four columns, the tiles' width
    parallel_rows(-(-n // 4), work, lambda g0, g1: f(*args, 4 * g0, min(n, 4 * g1)))


def matmul(
    a: np.ndarray,
    a_zp: Any,
    packed: PackedB,
    mult: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """(..., M, K) 8-bit ``a`` minus ``a_zp`` (None, one value, or one per row of M) times
    the packed (K, N) weights: int32, or float32 scaled as :func:`gemm` says."""
    k = a.shape[-1]
    lead = a.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    a2 = a.reshape(rows, k)
    buf, sa, shift = pack_a(a2, packed.b.shape[1])
    za = np.zeros(1, np.int64) if a_zp is None else np.asarray(a_zp).astype(np.int64).reshape(-1)
    if za.size == 1:
        za = np.full(rows, za[0] + shift, np.int64)
    else:
        # one per row of each (M, K) matrix, repeated over the leading axes
        za = np.tile(za, rows // za.size) + shift
    out = np.empty((rows, packed.n), np.int32 if mult is None else np.float32)
    gemm(buf, sa, za, packed, out, mult, bias)
    return out.reshape(*lead, packed.n)
