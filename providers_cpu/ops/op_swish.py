"""Swish (opset 24) on the CPU: x * sigmoid(alpha * x) in one pass (``logistic.py``).

float32 takes the compiled logistic, float64 (or numba off) NumPy's exp, other dtypes
the generic kernel.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_swish import swish as generic

from .logistic import x_sigmoid


@kernel("Swish", since=24)
def swish(node: NodeInfo, xp: Any):
    return x_sigmoid(generic(node, xp), float(node.attr("alpha", 1.0)))
