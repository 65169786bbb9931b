"""com.microsoft Gelu on CUDA: one launch of ``gelu_k`` (erf form, float32, rounded once).

Other dtypes and strided inputs run the generic kernel on the device.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_gelu_contrib as generic

from .fused_cuda import gelu_runner

_FLOATS = ("float", "float16", "bfloat16", "double")


@kernel("Gelu", domain="com.microsoft", dtypes=_FLOATS)
def gelu(node: NodeInfo, xp: Any):
    return gelu_runner(node, xp, generic.gelu(node, xp), tanh_form=False)
