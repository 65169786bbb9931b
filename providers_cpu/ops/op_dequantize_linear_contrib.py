"""com.microsoft DequantizeLinear: ONNX's DequantizeLinear in onnxruntime's domain.

The counterpart of com.microsoft QuantizeLinear (``UseQDQContribOps``, 16-bit and 4-bit
QDQ models): per tensor, per axis or blocked, as the ONNX op's kernel.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_dequantize_linear import dequantize_linear

_INTS = ("uint8", "int8", "uint16", "int16", "int32", "uint4", "int4")


@kernel("DequantizeLinear", since=1, domain="com.microsoft", dtypes={0: _INTS})
def dequantize_linear_contrib(node: Any, xp: Any):
    return dequantize_linear(node, xp)
