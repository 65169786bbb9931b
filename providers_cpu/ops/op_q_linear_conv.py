"""QLinearConv on NumPy: the generic kernel with ConvInteger's exact int32 convolution.

The convolution of X and W minus their zero points runs through the CPU Conv on float
BLAS, with the int32 result of the generic im2col product (op_conv_integer); the bias
and the requantization after it are the generic kernel's.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_q_linear_conv import build_q_linear_conv

from .op_conv_integer import integer_conv


@kernel("QLinearConv", since=10)
def q_linear_conv(node: Any, xp: Any):
    return build_q_linear_conv(node, xp, integer_conv(node, 3, 5))
