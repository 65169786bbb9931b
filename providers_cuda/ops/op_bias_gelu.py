"""com.microsoft BiasGelu on CUDA: one launch of ``gelu_k`` with the bias added in float32.

A bias that is not one value per last-axis element, other dtypes and strided inputs run
the generic kernel on the device.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_bias_gelu as generic

from .fused_cuda import gelu_runner

_FLOATS = ("float", "float16", "bfloat16", "double")


@kernel("BiasGelu", domain="com.microsoft", dtypes=_FLOATS)
def bias_gelu(node: NodeInfo, xp: Any):
    return gelu_runner(node, xp, generic.bias_gelu(node, xp), tanh_form=False)
