"""Softmax and LogSoftmax over the trailing dims of a small float32 input: the NumPy
kernel's steps with its reductions compiled (numba).

Imported only once ``jit.ENABLED`` has said numba is there and wanted. On a decoder step's
few hundred logits or an attention row of a few keys the NumPy kernel (``op_softmax``) is
two reductions with their keyword parsing, a finiteness check, subtract, exp, a sum and a
divide: 9-11 us here against onnxruntime's 1-3. Here the row maxima and the shift are one
compiled call, exp stays NumPy's (``np.exp`` in place), and the row sums and the division
(or the log's subtraction) are one more.

**Values**: the NumPy kernel's bits. The maximum is exact in any order (NaN wins, as in
``np.maximum``; a maximum that is not finite shifts by 0, as there); exp and log are
NumPy's own calls; each row's sum is NumPy's pairwise summation (``FLOAT_pairwise_sum``:
in order under 8 elements, eight running sums up to 128, halves on multiples of 8 past
it), added to the reduction's identity 0, as ``np.add.reduce`` over a contiguous last
axis does (checked against it for rows of 1-4096 elements).
"""

from __future__ import annotations

import math

import numpy as np

from .. import jit

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.softmax_loops needs numba (see providers_cpu/jit.py)")
nb = jit.nb

#: Elements up to which the compiled steps run; past it the NumPy calls' own cost is small
#: against their work (8 x 1000: the same time either way).
MAX_SIZE = 4096


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def shift(x, out):
    """out[r] = x[r] - max(x[r]) per row (0 for a maximum that is not finite)."""
    r_n, c_n = x.shape
    for r in range(r_n):
        m = x[r, 0]
        for c in range(1, c_n):
            v = x[r, c]
            if v > m or v != v:  # np.maximum: NaN wins
                m = v
                if v != v:
                    break
        if not math.isfinite(m):
            m = np.float32(0.0)
        for c in range(c_n):
            out[r, c] = x[r, c] - m


@nb.njit(inline="always", nogil=True, boundscheck=False, error_model="numpy")
def _block(a, lo, n):
    """FLOAT_pairwise_sum of a[lo:lo + n] for n <= 128: in order under 8, else eight
    running sums, paired, then the rest in order."""
    if n < 8:
        res = np.float32(0.0)
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    top = n - n % 8
    while i < top:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@nb.njit(nogil=True, boundscheck=False, error_model="numpy")
def _pairwise(a, n):
    """NumPy's FLOAT_pairwise_sum of a[:n] (float32): past 128 elements the two halves
    (split on a multiple of 8), each summed so, then added. Its recursion walked with an
    explicit stack (a recursive function in a disk-cached numba module crashed on load)."""
    if n <= 128:
        return _block(a, 0, n)
    los = np.empty(64, np.int64)
    ns = np.empty(64, np.int64)
    phase = np.empty(64, np.int64)
    vals = np.empty(64, np.float32)
    sp = 0
    vp = 0
    los[0], ns[0], phase[0] = 0, n, 0
    sp = 1
    while sp > 0:
        sp -= 1
        lo, m, ph = los[sp], ns[sp], phase[sp]
        if m <= 128:
            vals[vp] = _block(a, lo, m)
            vp += 1
        elif ph == 0:
            m2 = m // 2
            m2 -= m2 % 8
            los[sp], ns[sp], phase[sp] = lo, m, 1  # add the halves' sums after both
            los[sp + 1], ns[sp + 1], phase[sp + 1] = lo + m2, m - m2, 0
            los[sp + 2], ns[sp + 2], phase[sp + 2] = lo, m2, 0  # the left half first
            sp += 3
        else:
            vals[vp - 2] = vals[vp - 2] + vals[vp - 1]
            vp -= 1
    return vals[0]


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def divide_by_sums(e):
    """e[r] /= sum(e[r]) per row, the sum as np.add.reduce gives it."""
    r_n, c_n = e.shape
    for r in range(r_n):
        row = e[r]
        s = np.float32(0.0) + _pairwise(row, c_n)
        for c in range(c_n):
            row[c] = row[c] / s


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def sums(e, out):
    """out[r, 0] = sum(e[r]) per row, as np.add.reduce gives it."""
    r_n, c_n = e.shape
    for r in range(r_n):
        out[r, 0] = np.float32(0.0) + _pairwise(e[r], c_n)


# exp on float32 without a libm call (NumPy's float32 exp on AVX2 runs about 1.2 ns a
# value here, a Softmax over a classifier's 6625 classes 3x onnxruntime's): the range
# reduction and polynomial of jit's ``_logistic_value``, one helper (``exp_reduced``)
_exp_reduced = jit.helper("exp_reduced")
_LOW = np.float32(-88.72283)  # below it float32 exp is subnormal or 0: given as 0
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)


# Contraction only, as the helper (multiply-adds as FMAs): reassociation would fold its
# rounding's ``(a + R) - R`` to ``a``. Neither is inlined at numba's level, so the loop it
# is called from may reassociate its own sums while LLVM keeps these instructions' flags.
@nb.njit(nogil=True, boundscheck=False, fastmath={"contract"}, error_model="numpy")
def exp_nonpositive(t):
    """exp(t) for float32 t <= 0 (NaN stays NaN; below -88.72283, 0), 2e-7 relative."""
    low = t < _LOW
    if low:
        t = _LOW
    u = _exp_reduced(t)
    return _ZERO if low else u


def _softmax_flat(x, out, cols, log):
    """Softmax over flat C-contiguous arrays of rows of ``cols`` values: each row's maximum,
    then ``exp(x - max)`` by :func:`exp_nonpositive` and the row's sum in one pass, then one
    multiply by the sum's reciprocal (LogSoftmax's rows, ``log``: ``x - max - log(sum)``,
    the logarithm of each row's sum in float64, rounded once). One dispatch: a small Softmax's NumPy
    steps (two compiled calls around NumPy's exp, three reshapes) were 5-7x onnxruntime's
    node on a [1, 4] input, and a wide one's ``np.maximum.reduce`` over short rows costs as
    much as the pass. False (``out`` unfinished) where a row's maximum is not finite or it
    holds NaN (its sum is NaN). The rows go through as 2-D views: indexing the flat arrays
    at an offset instead kept LLVM from vectorising the exp loop (3x slower)."""
    rows = x.shape[0] // cols
    x2 = x.reshape((rows, cols))
    o2 = out.reshape((rows, cols))
    for r in range(rows):
        xr, o = x2[r], o2[r]
        m = xr[0]
        for c in range(cols):
            v = xr[c]
            m = v if v > m else m  # NaN is never taken: the sum below catches it
        if not math.isfinite(m):
            return False
        s = _ZERO
        for c in range(cols):
            e = exp_nonpositive(xr[c] - m)
            o[c] = e
            s += e
        if s != s:
            return False
        if log:
            ls = np.float32(math.log(np.float64(s)))
            for c in range(cols):
                o[c] = (xr[c] - m) - ls
        else:
            inv = _ONE / s
            for c in range(cols):
                o[c] *= inv
    return True


_softmax_flat.__qualname__ = f"softmax_flat_{jit.source_digest()}"
softmax_flat = nb.njit(cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})(
    _softmax_flat
)
