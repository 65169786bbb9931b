"""onnxep::ConvIntegerToFloat on NumPy: ConvInteger, an int32 Add, a Cast to float32 and a
Mul, as one kernel (``fuse_conv_integer_to_float`` emits it from those four nodes).

``y = float32(ConvInteger(x, w, x_zp, w_zp) + add) * scale``. On the VNNI tiles, when
``add`` and ``scale`` are one value or one per output channel, the addition joins the
zero-point terms and the scale multiplies each result as the tile writes it, so the
int32 tensor, its sum, its float copy and the product are never made; otherwise the
integer convolution (tiles or float BLAS) is followed by NumPy's Add, astype and
multiply, the unfused nodes' operations. Either way the same float32 bits: int32
addition wraps alike, and the rest is one rounding to float32 and one float32 product.
The op is the CPU provider's alone (its fusion runs there only); its fallback here is
the unfused nodes' own operations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from . import vnni_gemm
from .op_conv_integer import integer_conv, x_zero_point


def channel_vector(v: Any, channels: int, dtype: Any) -> np.ndarray | None:
    """``v`` as one value per output channel of an (N, C, H, W) result, where it broadcasts
    so (one value, or shape (..., C, 1, 1) with ones before); else None."""
    a = np.asarray(v)
    if a.size == 1:
        return np.full(channels, a.reshape(()), dtype)
    if a.ndim > 4 or a.size != channels:
        return None
    shape = (1,) * (4 - a.ndim) + a.shape
    return a.reshape(channels).astype(dtype) if shape == (1, channels, 1, 1) else None


@kernel("ConvIntegerToFloat", domain="onnxep", dtypes={0: ("uint8", "int8")})
def conv_integer_to_float(node: Any, xp: Any):
    op = node.op_type
    conv = integer_conv(node, 1, 3)
    tiles = conv.tiles

    def run(x, w, x_zp=None, w_zp=None, scale=None, add=None):
        if tiles is not None and x.ndim == 4 and vnni_gemm.available(x.dtype):
            sv = channel_vector(scale, w.shape[0], np.float32)
            av = None if add is None else channel_vector(add, w.shape[0], np.int32)
            if sv is not None and (add is None or av is not None):
                return (tiles(x, x_zero_point(x_zp, op), av, sv),)
        acc = conv(x, x_zp, w, w_zp)
        if add is not None:
            acc = acc + add
        return (acc.astype(np.float32) * scale,)

    return run
