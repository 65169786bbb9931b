"""com.microsoft QLinearConv: the ONNX QLinearConv, with ``channels_last`` for (N, *spatial, C)
inputs and outputs (onnxruntime's NHWC layout transformer writes it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from .op_q_linear_conv import q_linear_conv
from .qlinear import eight_bit


@kernel("QLinearConv", since=1, domain="com.microsoft", dtypes={0: ("uint8", "int8")})
def q_linear_conv_contrib(node: Any, xp: Any):
    eight_bit(node, 0, "x")
    conv = q_linear_conv(node, xp)
    if not node.attr("channels_last", 0):
        return conv

    def run(x, *rest):
        (y,) = conv(np.moveaxis(x, -1, 1), *rest)
        return (np.ascontiguousarray(np.moveaxis(y, 1, -1)),)

    return run
