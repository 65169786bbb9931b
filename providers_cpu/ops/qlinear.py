"""Shared math for the com.microsoft quantized (QLinear*, QGemm, ...) kernels on NumPy.

onnxruntime quantizes with ONNX's formula: ``saturate(round_half_even(v / scale) + zp)``,
computed in float32. Its element-wise kernels (sigmoid, leaky relu, concat, where)
go through a 256-entry table built with that formula from the dequantized input,
which is what :func:`lookup_table` builds here too, so both agree entry by entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported

from .. import jit, jit_int8
from .int_gemm import constant_b, scaled_matmul, shifted_b

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def eight_bit(node: Any, i: int, what: str) -> np.dtype | None:
    """The uint8/int8 dtype of input ``i`` (None when not known before the run); other types
    are declined."""
    dt = node.input_dtype(i)
    if dt is None:
        return None
    dt = np.dtype(dt)
    if dt not in _EIGHT_BIT:
        raise NotSupported(f"{node.op_type}: {what} must be uint8 or int8, not {dt.name}")
    return dt


def scalar(p: Any, op: str, what: str, default: float | int | None = None) -> Any:
    """The one value of a per-tensor scale or zero point (``default`` when omitted)."""
    if p is None:
        if default is None:
            raise InvalidArgument(f"{op}: input {what} is required")
        return default
    a = np.asarray(p)
    if a.size != 1:
        raise InvalidArgument(
            f"{op}: {what} must be a scalar or a 1-element tensor (per-tensor), got shape "
            f"{tuple(a.shape)}"
        )
    return a.reshape(()).item()


def saturate(q: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Rounded float values clamped into integer ``dt`` and cast; NaN becomes the minimum,
    as onnxruntime's ``max(x, lo)`` clamp makes it."""
    info = np.iinfo(dt)
    return np.minimum(np.fmax(q, info.min), info.max).astype(dt)


def quantize(v: np.ndarray, scale: float, zp: int, dt: np.dtype) -> np.ndarray:
    """float32 ``v`` to ``dt``: round half to even of ``v / scale``, plus ``zp``, saturated."""
    return saturate(np.rint(np.asarray(v, np.float32) / np.float32(scale)) + np.float32(zp), dt)


def dequantize(q: np.ndarray, scale: float, zp: int) -> np.ndarray:
    return (q.astype(np.int32) - np.int32(zp)).astype(np.float32) * np.float32(scale)


def requantize(acc: np.ndarray, multiplier: Any, zp: int, dt: np.dtype) -> np.ndarray:
    """An int32 accumulator times a float32 multiplier, rounded half to even, plus ``zp``."""
    return saturate(
        np.rint(acc.astype(np.float32) * np.asarray(multiplier, np.float32)) + np.float32(zp), dt
    )


def constant_inputs(node: Any, indices: Any) -> list | None:
    """The constant values of ``indices`` (None for omitted ones), or None if one varies."""
    out = []
    for i in indices:
        if not node.has_input(i):
            out.append(None)
            continue
        v = node.const_input(i)
        if v is None:
            return None
        out.append(v)
    return out


def all_codes(dt: np.dtype) -> np.ndarray:
    """Every value of an 8-bit type, ordered by its byte (so ``table[x.view(uint8)]``)."""
    return np.arange(256, dtype=np.uint8).view(dt)


def lookup_table(
    fn: Any, x_scale: float, x_zp: int, y_scale: float, y_zp: int, x_dt: np.dtype, y_dt: np.dtype
) -> np.ndarray:
    """``quantize(fn(dequantize(x)))`` for all 256 inputs, indexed by the input's byte."""
    return quantize(fn(dequantize(all_codes(x_dt), x_scale, x_zp)), y_scale, y_zp, y_dt)


def apply_table(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    return table[np.ascontiguousarray(x).view(np.uint8)]


def binary_kernel(node: Any, compute: Any):
    """QLinearAdd/QLinearMul: A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
    C_zero_point, every parameter per tensor (an omitted zero point is 0).

    ``compute(a, sa, za, b, sb, zb, sc, zc, dtype)`` returns C from the inputs and the
    parameters' values.
    """
    op = node.op_type
    a_dt, b_dt = node.input_dtype(0), node.input_dtype(3)
    if a_dt is not None and b_dt is not None and np.dtype(a_dt) != np.dtype(b_dt):
        raise NotSupported(f"{op}: A and B must have one type, got {a_dt} and {b_dt}")

    def run(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None):
        sa, za = scalar(a_scale, op, "A_scale"), scalar(a_zp, op, "A_zero_point", 0)
        sb, zb = scalar(b_scale, op, "B_scale"), scalar(b_zp, op, "B_zero_point", 0)
        sc, zc = scalar(c_scale, op, "C_scale"), scalar(c_zp, op, "C_zero_point", 0)
        return (compute(a, sa, za, b, sb, zb, sc, zc, a.dtype),)

    return run


def unary_table_kernel(node: Any, fn: Any):
    """QLinearSigmoid/QLinearLeakyRelu: X, X_scale, X_zero_point, Y_scale, Y_zero_point.

    The op is a function of one byte, so each run builds the 256-entry table for its
    scales (one per node when they are constants) and indexes it.
    """
    op = node.op_type
    dt = eight_bit(node, 0, "X")
    consts = constant_inputs(node, range(1, 5))
    fixed = None if consts is None or dt is None else _table_for(fn, op, *consts, dt)

    def run(x, x_scale, x_zp, y_scale, y_zp=None):
        table = fixed
        if table is None:
            table = _table_for(fn, op, x_scale, x_zp, y_scale, y_zp, x.dtype)
        return (apply_table(table, x),)

    return run


def _table_for(fn, op, x_scale, x_zp, y_scale, y_zp, dt):
    return lookup_table(
        fn,
        scalar(x_scale, op, "X_scale"),
        scalar(x_zp, op, "X_zero_point", 0),
        scalar(y_scale, op, "Y_scale"),
        scalar(y_zp, op, "Y_zero_point", 0),
        dt,
        dt,
    )


def requantizer(op: str, what: str, scale: Any, zp: Any, y_scale: float, y_zp: int, dt: np.dtype):
    """A function taking ``dt`` values at (scale, zp) to (y_scale, y_zp): a copy when they match,
    else the 256-entry dequantize/quantize table."""
    s, z = scalar(scale, op, f"{what} scale"), scalar(zp, op, f"{what} zero point", 0)
    if s == y_scale and z == y_zp:
        return lambda x: x
    table = lookup_table(lambda v: v, s, z, y_scale, y_zp, dt, dt)
    return lambda x: apply_table(table, x)


def per_column(p: Any, n: int, op: str, what: str) -> np.ndarray:
    """A per-tensor or per-column (length N) parameter as something that broadcasts over N."""
    a = np.asarray(p)
    if a.size == 1:
        return a.reshape(())
    if a.ndim == 1 and a.shape[0] == n:
        return a
    raise InvalidArgument(
        f"{op}: {what} must have 1 or N={n} elements (per column), got shape {tuple(a.shape)}"
    )


def integer_matmul_to_float(
    a: np.ndarray,
    a_zp: int,
    b: np.ndarray,
    b_zp: Any,
    multiplier: Any,
    bias: Any,
    op: str,
    packed: Any = None,
) -> np.ndarray:
    """``(a - a_zp) @ (b - b_zp)`` in int32, times ``multiplier`` (float32), plus ``bias``.

    The int32 product is int_gemm's (float BLAS, exact); ``packed`` is B already shifted
    (:func:`packed_b` of a constant B), else B is shifted here.
    """
    if packed is None:
        packed = shifted_b(b, column_zero_point(b, b_zp, op), op)
    return scaled_matmul(a, np.int32(a_zp), packed, op, multiplier, bias)


def column_zero_point(b: np.ndarray, zp: Any, op: str) -> Any:
    """B's zero point, per tensor or per column, checked."""
    return None if zp is None else per_column(zp, b.shape[-1], op, "B zero point")


def packed_b(node: Any, b: int, zp: int) -> Any:
    """Input ``b`` minus zero point input ``zp``, shifted once when both are constants."""
    return constant_b(node, b, zp, lambda w, z: column_zero_point(w, z, node.op_type))


def dynamic_uint8_compiled(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.float32] | None:
    """DynamicQuantizeLinear's (uint8 X, scale, zero point) in one compiled pass over float32
    ``x``, bit for bit its NumPy operations; None without numba, for an empty ``x``, or
    when a value is NaN or infinite (NumPy's rules then apply)."""
    if not jit.ENABLED or x.size == 0:
        return None
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(x.shape, np.uint8)
    ok, scale, zp = jit_int8.loop("dq_uint8")(flat, flat.view(np.int32), out.reshape(-1))
    return (out, np.float32(scale), np.float32(zp)) if ok else None


def dynamic_uint8(a: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """(quantized A, scale, zero point) over A's range widened to include 0."""
    fast = dynamic_uint8_compiled(a)
    if fast is not None:
        # DynamicQuantizeLinear's zero range has scale 0 (dividing by 1); here it is 1.
        # Its values and zero point are the same: the zero point's formula agrees (clip
        # and rint commute on it), and saturation differs from the clip only at NaN.
        q, scale, zp = fast
        return q, np.float32(1) if scale == 0 else scale, int(zp)
    lo = np.float32(min(float(a.min()), 0.0)) if a.size else np.float32(0)
    hi = np.float32(max(float(a.max()), 0.0)) if a.size else np.float32(0)
    scale = np.float32(1) if hi == lo else np.float32((hi - lo) / np.float32(255))
    zp = int(np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)))
    return quantize(a, scale, zp, np.dtype(np.uint8)), scale, zp


def dequantize_per_column(
    w: np.ndarray, scale: np.ndarray, zp: Any, op: str, what: str
) -> np.ndarray:
    """[dirs, k, n] 8-bit weights with [dirs] or [dirs, n] scales and zero points, in float32."""
    dirs, _, n = w.shape
    shapes = ((dirs,), (dirs, n))
    for name, p in ((f"{what}_scale", scale), (f"{what}_zero_point", zp)):
        if p is not None and tuple(np.shape(p)) not in shapes:
            raise InvalidArgument(
                f"{op}: {name} must be [{dirs}] or [{dirs}, {n}], got {np.shape(p)}"
            )
    s = np.asarray(scale, np.float32).reshape(dirs, 1, -1)
    z = (
        np.zeros((dirs, 1, 1), np.int32)
        if zp is None
        else np.asarray(zp).astype(np.int32).reshape(dirs, 1, -1)
    )
    return (w.astype(np.int32) - z).astype(np.float32) * s
