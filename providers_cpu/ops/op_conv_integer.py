"""ConvInteger on NumPy: the CPU Conv (im2col and one BLAS GEMM) on exact float operands.

The generic kernel's im2col product runs in int32, which NumPy does without BLAS
(135 ms over ddddocr's 21 ConvIntegers). Here X and W minus their zero points go
through the CPU Conv runner in float32 when every partial sum is provably at most
2^24, else float64 (int_gemm's argument: per output channel, the sum of |w - w_zp|
over its window times the largest |x - x_zp|), so the int32 result is the generic
kernel's bit for bit. Padding is 0 after the zero point is taken off, as the generic
kernel pads. Constant weights are shifted, measured and packed once per session.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel
from onnxep.providers.ops.quant import conv_nd, conv_params

from .int_gemm import F32_EXACT, compute_dtype, data_max, row_l1, shifted_max, to_int32
from .op_conv import build_conv


def _x_zero_point(zp: Any, op: str) -> int:
    if zp is None:
        return 0
    z = np.asarray(zp)
    if z.size != 1:
        raise InvalidArgument(
            f"{op}: x_zero_point must be a scalar (per tensor), got shape {tuple(z.shape)}"
        )
    return int(z.reshape(()))


def shift_w(w: np.ndarray, zp: Any, op: str) -> np.ndarray:
    """W minus its zero point (per tensor, or per output channel) in int64."""
    wi = w.astype(np.int64)
    if zp is None:
        return wi
    z = np.asarray(zp).astype(np.int64)
    if z.size == 1:
        return wi - z.reshape(())
    if z.ndim == 1 and z.shape[0] == w.shape[0]:
        return wi - z.reshape((-1,) + (1,) * (w.ndim - 1))
    raise InvalidArgument(
        f"{op}: w_zero_point must have 1 element or one per output channel "
        f"(M={w.shape[0]}), got shape {tuple(z.shape)}"
    )


@kernel("ConvInteger", since=10)
def conv_integer(node: Any, xp: Any):
    op = node.op_type
    w_const = node.const_input(1)
    zp_const = node.const_input(3) if node.has_input(3) else None
    fixed = None
    if w_const is not None and (zp_const is not None or not node.has_input(3)):
        shifted = shift_w(np.asarray(w_const), zp_const, op)
        fixed = (shifted.astype(np.float64), row_l1(shifted))
    conv = build_conv(node, weight=None if fixed is None else fixed[0], with_bias=False)

    def run(x, w, x_zero_point=None, w_zero_point=None):
        zx = _x_zero_point(x_zero_point, op)
        if fixed is not None:
            wf, l1 = fixed
        else:
            shifted = shift_w(w, w_zero_point, op)
            wf, l1 = shifted.astype(np.float64), row_l1(shifted)
        bound = shifted_max(x.dtype, zx) * l1
        if bound > F32_EXACT:
            bound = data_max(x, zx) * l1
        cdt = compute_dtype(bound)
        if cdt is None:
            # Past float64's exact range (windows of 10^11 weights): the generic integer
            # im2col, in int64.
            p = conv_params(node, node.inputs[1].shape if node.inputs[1] else None, None)
            xi = x.astype(np.int64) - zx
            return (to_int32(conv_nd(xi, wf.astype(np.int64), p, np), bound),)
        xf = x.astype(cdt)
        if zx:
            xf -= cdt.type(zx)
        (y,) = conv(xf, wf)
        return (to_int32(y, bound),)

    return run
