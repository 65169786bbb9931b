"""ConvInteger on NumPy: the CPU Conv (im2col and one BLAS GEMM) on exact float operands.

The generic kernel's im2col product runs in int32, which NumPy does without BLAS
(135 ms over ddddocr's 21 ConvIntegers). Here X and W minus their zero points go
through the CPU Conv runner in float32 when every partial sum is provably at most
2^24, else float64 (int_gemm's argument: per output channel, the sum of |w - w_zp|
over its window times the largest |x - x_zp|), so the int32 result is the generic
kernel's bit for bit. Padding is 0 after the zero point is taken off, as the generic
kernel pads. Constant weights are shifted, measured and packed once per session.
QLinearConv's integer part is the same (:func:`integer_conv`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import conv_out_dims, resolve_pads
from onnxep.providers.ops.op_conv import conv_setup
from onnxep.providers.ops.quant import conv_nd, conv_params

from . import vnni_gemm
from .int_gemm import F32_EXACT, compute_dtype, data_max, narrow, row_l1, shifted_max, to_int32
from .op_conv import build_conv


def x_zero_point(zp: Any, op: str) -> int:
    """X's zero point as an int (0 when omitted); per tensor only."""
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


def integer_conv(node: Any, w_index: int, zw_index: int):
    """``conv(x - x_zp, w - w_zp)`` in int32 as ``fn(x, x_zp, w, w_zp)``, exact, with the
    weight (input ``w_index``) and its zero point (input ``zw_index``) packed once when
    they are constants."""
    op = node.op_type
    w_const = node.const_input(w_index)
    has_zw = node.has_input(zw_index)
    zw_const = node.const_input(zw_index) if has_zw else None
    fixed = None
    if w_const is not None and (zw_const is not None or not has_zw):
        shifted = shift_w(np.asarray(w_const), zw_const, op)
        fixed = (narrow(shifted), row_l1(shifted))
    conv = build_conv(node, integer_weights=(w_index, None if fixed is None else fixed[0]))
    tiles = None
    if fixed is not None and w_const.ndim == 4 and vnni_gemm.available(w_const.dtype):
        tiles = _vnni_conv(node, w_index, np.asarray(w_const), zw_const)

    def run(x, x_zp, w, w_zp):
        """conv(x - x_zp, w - w_zp), int32."""
        zx = x_zero_point(x_zp, op)
        if tiles is not None and x.ndim == 4 and vnni_gemm.available(x.dtype):
            return tiles(x, zx)
        if fixed is not None:
            wf, l1 = fixed
        else:
            shifted = shift_w(w, w_zp, op)
            wf, l1 = shifted, row_l1(shifted)
        bound = shifted_max(x.dtype, zx) * l1
        if bound > F32_EXACT:
            bound = data_max(x, zx) * l1
        cdt = compute_dtype(bound)
        if cdt is None:
            # Past float64's exact range (windows of 10^11 weights): the generic integer
            # im2col, in int64.
            p = conv_params(
                node, node.inputs[w_index].shape if node.inputs[w_index] else None, None
            )
            xi = x.astype(np.int64) - zx
            return to_int32(conv_nd(xi, wf.astype(np.int64), p, np), bound)
        # one pass: the subtraction runs in the float type
        xf = np.subtract(x, zx, dtype=cdt)
        (y,) = conv(xf, wf)
        return to_int32(y, bound)

    # the tiles' runner, for ConvIntegerToFloat's epilogue (None where they cannot run)
    run.tiles = tiles
    return run


def _vnni_conv(node: Any, w_index: int, w: np.ndarray, zw: Any):
    """``fn(x, zx, add=None, scale=None)``: a 2-D group-1 convolution on the VNNI tiles
    (vnni_gemm.PackedConv.run says what ``add`` and ``scale`` do), or None for another."""
    op = node.op_type
    group, ks, strides, dil, pb0, pe0, auto_pad = conv_setup(node, w_index)
    if group != 1 or len(strides) != 2:
        return None
    ks = list(ks or w.shape[2:])
    if list(w.shape[2:]) != ks:
        return None  # the generic path says what is wrong
    packed = vnni_gemm.PackedConv(w, zw)

    def run(x, zx, add=None, scale=None):
        n, c, h, wd = x.shape
        if c != w.shape[1]:
            raise InvalidArgument(f"{op}: X has {c} channels, W expects {w.shape[1]} (group 1)")
        pb, pe = resolve_pads(auto_pad, (h, wd), ks, strides, dil, pb0, pe0)
        oh, ow = conv_out_dims(op, (h, wd), pb, pe, ks, dil, strides)
        geo = (ks[0], ks[1], strides[0], strides[1], dil[0], dil[1], pb[0], pb[1])
        return packed.run(x, zx, geo, (oh, ow), add, scale)

    return run


@kernel("ConvInteger", since=10)
def conv_integer(node: Any, xp: Any):
    conv = integer_conv(node, 1, 3)

    def run(x, w, x_zero_point=None, w_zero_point=None):
        return (conv(x, x_zero_point, w, w_zero_point),)

    return run
