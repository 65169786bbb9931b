"""com.microsoft QLinearSoftmax, computed as onnxruntime computes it.

onnxruntime does not dequantize: it looks ``exp((x - max) * x_scale)`` up in a
256-entry float32 table (scaled up so the row sum stays finite), sums the row, and
writes ``round(e * floor(1 / y_scale) / sum) + y_zp``, saturated to Y's type;
``x_zero_point`` cancels out. Opset < 13
(the ``opset`` attribute) softmaxes over everything from ``axis`` on, 13 over ``axis``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel

from ._qlinear import eight_bit, saturate, scalar

_FLT_MAX = float(np.finfo(np.float32).max)


def _exp_table(x_scale: float, reduce_len: int) -> np.ndarray:
    """``table[255 - d] = exp((shift - d) * x_scale)`` for a row max minus x of ``d``."""
    shift = max(0.0, math.log(np.float32(_FLT_MAX / reduce_len)) - 5.0) / x_scale
    i = np.arange(256, dtype=np.float64)
    return np.exp((i - 255.0 + shift) * float(x_scale)).astype(np.float32)


@kernel("QLinearSoftmax", since=1, domain="com.microsoft", dtypes=("uint8", "int8"))
def q_linear_softmax(node: Any, xp: Any):
    opset = node.attr("opset", None)
    if opset is None:
        raise NotSupported("QLinearSoftmax: the required attribute 'opset' is missing")
    opset = int(opset)
    axis = int(node.attr("axis", 1 if opset < 13 else -1))
    dt = eight_bit(node, 0, "X")
    op = node.op_type

    def run(x, x_scale, x_zp, y_scale, y_zp=None):
        rank = x.ndim
        if not -rank <= axis < max(rank, 1):
            raise InvalidArgument(f"QLinearSoftmax: axis {axis} is out of range for rank {rank}")
        ax = axis % rank if rank else 0
        if opset < 13:
            rows = x.reshape(int(np.prod(x.shape[:ax], dtype=np.int64)), -1)
        else:
            rows = np.moveaxis(x, ax, -1)
        y_dt = dt or x.dtype
        if x.size == 0:
            return (np.empty(x.shape, y_dt),)
        table = _exp_table(scalar(x_scale, op, "x_scale"), rows.shape[-1])
        ys = np.float32(math.floor(1.0 / np.float32(scalar(y_scale, op, "y_scale"))))
        zp = int(scalar(y_zp, op, "y_zero_point", 0))
        xi = rows.astype(np.int32)
        d = xi.max(axis=-1, keepdims=True) - xi  # 0..255
        e = table[255 - d]
        total = e.sum(axis=-1, dtype=np.float32, keepdims=True)
        y = saturate(np.rint((e * ys) / total) + np.float32(zp), y_dt)
        if opset < 13:
            return (y.reshape(x.shape),)
        return (np.ascontiguousarray(np.moveaxis(y, -1, ax)),)

    return run
