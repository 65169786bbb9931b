"""Shared pieces of the elementwise kernels.

Run-builders for unary, binary and variadic ops (with the opset < 7
``broadcast``/``axis`` attributes), the dtype policy for the narrow float
types, an ``erf`` written in plain array operations (NumPy has no erf ufunc;
Gelu imports it too), and the numeric part of Cast.

Narrow floats (bfloat16, float8, float4...) are ml_dtypes types: array
libraries other than NumPy lack them and NumPy lacks many of their ufuncs, so
kernels compute those in float32 and cast the result back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from onnxep.providers.dtypes import np_dtype
from onnxep.providers.kernel import direct

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

#: Float dtypes computed in float32 and cast back.
NARROW_FLOATS = frozenset(
    np.dtype(getattr(ml_dtypes, n))
    for n in (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn",
        "float6_e2m3fn",
        "float6_e3m2fn",
    )
    if hasattr(ml_dtypes, n)
)
#: For formulas of several steps, float16 too: rounding every step to float16
#: would cost more precision than the tests allow.
HALF_FLOATS = NARROW_FLOATS | {F16}

#: Sub-byte integer dtypes ml_dtypes stores one per byte.
SUB_BYTE_INTS = frozenset(
    np.dtype(getattr(ml_dtypes, n))
    for n in ("int4", "uint4", "int2", "uint2")
    if hasattr(ml_dtypes, n)
)


# -- run-builders -----------------------------------------------------------------


def unary(
    xp: Any, f: Callable[[Any], Any], upcast: frozenset = NARROW_FLOATS, cast_back: bool = True
) -> Callable:
    """``run(x) -> (f(x),)``, computing dtypes in ``upcast`` in float32.

    ``cast_back=False`` leaves the result as ``f`` made it (predicates return
    bool). ``xp.asarray`` turns the NumPy scalar a 0-d ufunc call returns back
    into an array.
    """

    def run(x):
        dt = x.dtype
        if dt in upcast:
            r = xp.asarray(f(x.astype(F32)))
            return (r.astype(dt) if cast_back else r,)
        return (xp.asarray(f(x)),)

    return direct(run, f, upcast)


def legacy_axis(node: Any) -> int | None:
    """The ``axis`` of an opset < 7 binary op with ``broadcast=1`` and an explicit axis.

    Those versions align B with A starting at ``axis`` instead of at the
    trailing dims; without ``axis`` the alignment is NumPy's.
    """
    if node.opset >= 7 or not node.attr("broadcast", 0) or "axis" not in node.attrs:
        return None
    return int(node.attrs["axis"])


def align_legacy(b: Any, a_ndim: int, axis: int) -> Any:
    if axis < 0:
        axis += a_ndim
    pad = a_ndim - axis - b.ndim
    return b.reshape(tuple(b.shape) + (1,) * pad) if pad > 0 else b


def binary(
    node: Any,
    xp: Any,
    f: Callable[[Any, Any], Any],
    upcast: frozenset = NARROW_FLOATS,
    cast_back: bool = True,
) -> Callable:
    """``run(a, b) -> (f(a, b),)`` with NumPy broadcasting (or the legacy kind).

    Dtypes in ``upcast`` are computed in float32; ``cast_back=False`` leaves the
    result as ``f`` made it (comparisons return bool).
    """
    axis = legacy_axis(node)

    def run(a, b):
        if axis is not None:
            b = align_legacy(b, a.ndim, axis)
        dt = a.dtype
        if dt in upcast:
            r = xp.asarray(f(a.astype(F32), b.astype(F32)))
            return (r.astype(dt) if cast_back else r,)
        return (xp.asarray(f(a, b)),)

    return run if axis is not None else direct(run, f, upcast)


def variadic(xp: Any, f: Callable[[Any, Any], Any], upcast: frozenset = NARROW_FLOATS) -> Callable:
    """``run(*xs)``: ``f`` folded over the inputs, broadcasting as it goes."""

    def run(*xs):
        dt = xs[0].dtype
        if dt in upcast:
            r = functools.reduce(f, [x.astype(F32) for x in xs])
            return (xp.asarray(r).astype(dt),)
        if len(xs) == 1:
            return (xs[0],)
        return (xp.asarray(functools.reduce(f, xs)),)

    return run


# -- special functions ------------------------------------------------------------------

# Chebyshev series fitted (against mpmath) for this module:
#   erf(x) = x * S(2x^2 - 1) on |x| < 1,
#   erfc(x) = exp(-x^2) * T((2/x - 7/6) / (5/6)) on 1 <= x <= 6 (1/x mapped onto [-1, 1]).
# Both reach float64 rounding (erf within ~5e-16 relative); beyond 6, erf is +-1 in float64.
_ERF_SMALL = (
    0.9754769393826541,
    -0.14226120510371373,
    0.010035582187599762,
    -0.0005768764699767438,
    2.7419931252261336e-05,
    -1.1043175507409684e-06,
    3.848875538373537e-08,
    -1.1808582398088907e-09,
    3.2334189086139675e-11,
    -7.990937047407786e-13,
    1.7960959206477656e-14,
    -3.593214248282038e-16,
    -3.126110783925072e-17,
)
_ERF_TAIL = (
    0.2747746858979528,
    0.16699329119310394,
    -0.014778434908201295,
    0.0004607660043734866,
    0.00017657967835406753,
    -5.026984064250556e-05,
    7.4270133555848666e-06,
    -3.5188112188590465e-07,
    -1.7150112884678165e-07,
    6.70662304885643e-08,
    -1.4316589298219361e-08,
    1.759556729463025e-09,
    7.452126820025356e-11,
    -1.1543783804174661e-10,
    3.887352392945903e-11,
    -8.504870179446378e-12,
    1.1272366030609998e-12,
    4.3308245325483215e-14,
    -8.425529248850642e-14,
    3.199379088675721e-14,
    -8.159360457100613e-15,
    1.377730698788173e-15,
    -8.342149575466922e-17,
    -7.810461294327749e-17,
    1.0555761659794076e-17,
)


def _truncated(coefs: tuple[float, ...], tol: float) -> tuple[float, ...]:
    # A Chebyshev series' error is about the sum of what it drops.
    n = len(coefs)
    while n > 1 and sum(abs(c) for c in coefs[n - 1 :]) < tol:
        n -= 1
    return coefs[:n]


# float32 needs only the terms above its rounding.
_ERF_SMALL_32 = _truncated(_ERF_SMALL, 1e-9)
_ERF_TAIL_32 = _truncated(_ERF_TAIL, 1e-9)


def _chebyshev(s: Any, coefs: tuple[float, ...]) -> Any:
    """Clenshaw's recurrence: stable where expanding to powers of ``s`` is not."""
    b1: Any = 0.0
    b2: Any = 0.0
    s2 = 2 * s
    for c in coefs[:0:-1]:
        b1, b2 = s2 * b1 - b2 + c, b1
    return s * b1 - b2 + coefs[0]


def erf(xp: Any, x: Any) -> Any:
    """The error function of a float array, in its own dtype (narrow floats via float32)."""
    dt = x.dtype
    if dt != F32 and dt != F64:
        return erf(xp, x.astype(F32)).astype(dt)
    small_c, tail_c = (_ERF_SMALL, _ERF_TAIL) if dt == F64 else (_ERF_SMALL_32, _ERF_TAIL_32)
    a = xp.abs(x)
    u = xp.minimum(a, 1.0)
    small = x * _chebyshev(2 * u * u - 1, small_c)
    # Clamping keeps both branches finite; NaN passes through the clamp.
    t = xp.minimum(xp.maximum(a, 1.0), 6.0)
    erfc = xp.exp(-t * t) * _chebyshev((2 / t - 7 / 6) * 1.2, tail_c)
    tail = 1 - erfc
    return xp.where(a < 1, small, xp.where(x < 0, -tail, tail))


def sigmoid(xp: Any, x: Any) -> Any:
    """1 / (1 + exp(-x)) without overflowing exp for large |x|."""
    e = xp.exp(-xp.abs(x))
    r = 1 / (1 + e)
    return xp.where(x >= 0, r, e * r)


def softplus(xp: Any, x: Any) -> Any:
    """log(1 + exp(x)), exact for large |x| too."""
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


# -- casts ------------------------------------------------------------------------------

_FLOAT8 = frozenset(
    np.dtype(getattr(ml_dtypes, n))
    for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu) if hasattr(ml_dtypes, "float8_e8m0fnu") else None


def onnx_to_dtype(to: Any) -> np.dtype:
    """The dtype of a Cast ``to`` attribute: an element type, or a name in Cast-1."""
    from onnx import TensorProto

    if isinstance(to, bytes):
        to = to.decode()
    try:
        if isinstance(to, str):
            to = TensorProto.DataType.Value(to.upper())
        return np_dtype(int(to))
    except ValueError as exc:
        from onnxep.errors import NotSupported

        raise NotSupported(f"Cast: target type {to!r} has no array dtype here ({exc})") from None


def _to_e8m0(xp: Any, x: Any, saturate: bool, round_mode: str) -> Any:
    """Float to float8e8m0 (a bare exponent), rounding by ``round_mode``.

    Only the float32 exponent survives; the mantissa decides the rounding.
    NaN and infinity keep the all-ones exponent, which e8m0 reads as NaN.
    """
    bits = x.astype(F32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exp == 0xFF
    if round_mode == "up":
        up = (bits & 0x7FFFFF) != 0
    elif round_mode == "nearest":
        guard = (bits & 0x400000) != 0
        rest = (bits & 0x3FFFFF) != 0
        up = guard & (rest | (exp > 0))
    elif round_mode == "down":
        up = xp.zeros(bits.shape, dtype=bool)
    else:
        from onnxep.errors import NotSupported

        raise NotSupported(f"Cast: round_mode {round_mode!r} is not one of up, down, nearest")
    up = up & ~special
    if saturate:
        up = up & (exp != 0xFE)
    exp = exp + up.astype(np.uint16)
    out = xp.where(special, 0xFF, xp.minimum(exp, 0xFF)).astype(np.uint8)
    return out.view(_E8M0)


def cast_numeric(xp: Any, x: Any, to: np.dtype, saturate: bool = True, round_mode: str = "up"):
    """Cast a numeric (or bool) array to ``to`` by ONNX Cast rules."""
    src = x.dtype
    if src == to:
        return x
    if to in _FLOAT8:
        # ml_dtypes converts from float32/float64 with round-to-nearest-even;
        # saturation clamps first so out-of-range values land on the max.
        xf = x if src in (F32, F64) else x.astype(F32)
        if saturate:
            m = float(ml_dtypes.finfo(to).max)
            xf = xp.minimum(xp.maximum(xf, -m), m)
        return xf.astype(to)
    if _E8M0 is not None and to == _E8M0:
        return _to_e8m0(xp, x, saturate, round_mode)
    if to in NARROW_FLOATS and src.kind not in "f":
        # ml_dtypes lacks some direct conversions (bool, sub-byte ints).
        return x.astype(F32).astype(to)
    if src in NARROW_FLOATS and to.kind not in "f":
        return x.astype(F32).astype(to)
    if src in SUB_BYTE_INTS and to == np.dtype(bool):
        return x.astype(np.int8).astype(bool)
    if to in SUB_BYTE_INTS and src == np.dtype(bool):
        return x.astype(np.int8).astype(to)
    return x.astype(to)
