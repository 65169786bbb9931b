"""com.microsoft QuantizeLinear: ONNX's QuantizeLinear in onnxruntime's domain.

What onnxruntime.quantization writes for QDQ models with ``UseQDQContribOps`` (and for
16-bit and 4-bit types before ONNX had them): per tensor, per axis or blocked, rounding
half to even and saturating, as the ONNX op's kernel does.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_quantize_linear import quantize_linear

_FLOATS = ("float", "float16")


@kernel("QuantizeLinear", since=1, domain="com.microsoft", dtypes={0: _FLOATS, 1: _FLOATS})
def quantize_linear_contrib(node: Any, xp: Any):
    return quantize_linear(node, xp)
