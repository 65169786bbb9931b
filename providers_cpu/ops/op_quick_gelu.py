"""com.microsoft QuickGelu on the CPU: x * sigmoid(alpha * x) in one pass (``logistic.py``).

onnxruntime's transformer optimiser writes it for CLIP's GELU and for x * Sigmoid(x)
(alpha 1); float32 takes the compiled logistic, float64 (or numba off) NumPy's exp,
other dtypes the generic kernel.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_quick_gelu import quick_gelu as generic

from .logistic import x_sigmoid


@kernel("QuickGelu", domain="com.microsoft", dtypes=("float", "float16", "bfloat16", "double"))
def quick_gelu(node: NodeInfo, xp: Any):
    return x_sigmoid(generic(node, xp), float(node.attr("alpha", 1.702)))
