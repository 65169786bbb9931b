"""com.microsoft QLinearAveragePool: AveragePool of the dequantized input, requantized.

As onnxruntime: X is dequantized to float32, averaged with AveragePool's attributes
(``count_include_pad``, ``ceil_mode``, pads, strides), and quantized with Y's scale and
zero point: ``round_half_even(y / y_scale + y_zp)`` with the zero point added before the
rounding, in float32, as onnxruntime's pool does. ``channels_last`` reads (N, *spatial, C).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_average_pool import average_pool

from ._qlinear import dequantize, eight_bit, saturate, scalar


@kernel("QLinearAveragePool", since=1, domain="com.microsoft", dtypes=("uint8", "int8"))
def q_linear_average_pool(node: Any, xp: Any):
    op = node.op_type
    eight_bit(node, 0, "X")
    last = bool(node.attr("channels_last", 0))
    pool = average_pool(node, xp)

    def run(x, x_scale, x_zp, y_scale, y_zp=None):
        v = dequantize(x, scalar(x_scale, op, "x_scale"), scalar(x_zp, op, "x_zero_point", 0))
        if last:
            v = np.moveaxis(v, -1, 1)
        (y,) = pool(v)
        if last:
            y = np.moveaxis(y, 1, -1)
        ys, yz = scalar(y_scale, op, "y_scale"), scalar(y_zp, op, "y_zero_point", 0)
        q = np.rint(y.astype(np.float32) / np.float32(ys) + np.float32(yz))
        return (np.ascontiguousarray(saturate(q, x.dtype)),)

    return run
