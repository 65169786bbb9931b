"""Swish (opset 24) on the CPU: x * sigmoid(alpha * x) in one pass (``logistic.py``).

float32 takes the compiled logistic, float64 (or numba off) NumPy's exp, other dtypes
the generic kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_swish import swish as generic

from .logistic import logistic

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


@kernel("Swish", since=24)
def swish(node: NodeInfo, xp: Any):
    general = generic(node, xp)
    alpha = float(node.attr("alpha", 1.0))

    def run(x):
        if x.dtype not in _FAST:
            return general(x)
        return (logistic(x, alpha, mul=True),)

    return run
