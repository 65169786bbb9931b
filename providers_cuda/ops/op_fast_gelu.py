"""com.microsoft FastGelu on CUDA: one launch of ``gelu_k`` (tanh form, optional bias).

A bias that is not one value per last-axis element, other dtypes and strided inputs run
the generic kernel on the device.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_fast_gelu as generic

from .fused_cuda import gelu_runner

_FLOATS = ("float", "float16", "bfloat16", "double")


@kernel("FastGelu", domain="com.microsoft", dtypes=_FLOATS)
def fast_gelu(node: NodeInfo, xp: Any):
    return gelu_runner(node, xp, generic.fast_gelu(node, xp), tanh_form=True)
