"""com.microsoft QLinearGlobalAveragePool: the mean of each channel, requantized.

As onnxruntime: the int32 sum of a channel minus ``x_zp * size``, times
``x_scale / (y_scale * size)`` in float32, rounded half to even, plus ``y_zp``.
``channels_last`` reads (N, *spatial, C) instead of (N, C, *spatial).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel

from ._qlinear import eight_bit, requantize, scalar


@kernel("QLinearGlobalAveragePool", since=1, domain="com.microsoft", dtypes=("uint8", "int8"))
def q_linear_global_average_pool(node: Any, xp: Any):
    op = node.op_type
    last = bool(node.attr("channels_last", 0))
    eight_bit(node, 0, "X")

    def run(x, x_scale, x_zp, y_scale, y_zp=None):
        if x.ndim < 3:
            raise InvalidArgument(f"{op}: X must have rank 3 or more, got shape {x.shape}")
        axes = tuple(range(1, x.ndim - 1)) if last else tuple(range(2, x.ndim))
        size = int(np.prod([x.shape[a] for a in axes]))
        zx = int(scalar(x_zp, op, "x_zero_point", 0))
        acc = x.astype(np.int32).sum(axis=axes, keepdims=True, dtype=np.int32) - np.int32(zx * size)
        mult = np.float32(scalar(x_scale, op, "x_scale")) / (
            np.float32(scalar(y_scale, op, "y_scale")) * np.float32(size)
        )
        return (requantize(acc, mult, int(scalar(y_zp, op, "y_zero_point", 0)), x.dtype),)

    return run
