"""com.microsoft QLinearAdd: (a - a_zp) * a_scale + (b - b_zp) * b_scale, requantized to C's.

onnxruntime's x86-64 kernel (AVX2) does not divide by c_scale: it folds the scales into
the ratios ``ra = a_scale / c_scale`` and ``rb = b_scale / c_scale`` and a constant
``c_zp - (ra * a_zp + rb * b_zp)``, and evaluates ``a * ra + (b * rb + const)`` with two
fused multiply-adds in float32 before rounding half to even and saturating. That rounds
differently from the textbook formula about once in a hundred elements, so this kernel
evaluates the same expression (a float32 fma is exact in float64 before its one rounding).
Where one side is constant along the innermost axis, onnxruntime adds that side into the
constant first (a multiply and an add), and so does this kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from ._qlinear import binary_kernel, saturate


def _fma(x: np.ndarray, y: Any, z: Any) -> np.ndarray:
    return (x.astype(np.float64) * np.float64(y) + np.asarray(z, np.float64)).astype(np.float32)


def _scalar_side(a: np.ndarray, b: np.ndarray) -> str:
    """Which input onnxruntime's broadcaster feeds as a scalar: "a", "b", or "" for neither."""
    if a.size == 1 and b.size != 1:
        return "a"
    if b.size == 1:
        return "b"
    rank = max(a.ndim, b.ndim)
    sa = (1,) * (rank - a.ndim) + a.shape
    sb = (1,) * (rank - b.ndim) + b.shape
    for da, db in zip(reversed(sa), reversed(sb)):
        if da == db == 1:
            continue
        if da == db:
            return ""
        return "a" if da == 1 else "b"
    return ""


def _add(a, sa, za, b, sb, zb, sc, zc, dt):
    ra = np.float32(np.float32(sa) / np.float32(sc))
    rb = np.float32(np.float32(sb) / np.float32(sc))
    const = np.float32(np.float32(zc) - np.float32(ra * np.float32(za) + rb * np.float32(zb)))
    af, bf = a.astype(np.float32), b.astype(np.float32)
    side = _scalar_side(a, b)
    if side == "a":
        y = _fma(bf, rb, (const + af * ra).astype(np.float32))
    elif side == "b":
        y = _fma(af, ra, (const + bf * rb).astype(np.float32))
    else:
        y = _fma(af, ra, _fma(bf, rb, const))
    # int32 conversion (NaN to the minimum), 16-bit saturation, then the output type's
    return saturate(np.minimum(np.fmax(np.rint(y), -32768), 32767), np.dtype(dt))


@kernel(
    "QLinearAdd",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("uint8", "int8"), 3: ("uint8", "int8")},
)
def q_linear_add(node: Any, xp: Any):
    return binary_kernel(node, _add)
