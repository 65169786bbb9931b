"""com.microsoft QLinearLeakyRelu: LeakyRelu(alpha) of the dequantized input, requantized."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from ._qlinear import unary_table_kernel


@kernel("QLinearLeakyRelu", since=1, domain="com.microsoft", dtypes=("uint8", "int8"))
def q_linear_leaky_relu(node: Any, xp: Any):
    alpha = np.float32(node.attr("alpha", 0.01))
    return unary_table_kernel(node, lambda v: np.where(v >= 0, v, v * alpha).astype(np.float32))
