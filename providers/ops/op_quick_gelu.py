"""com.microsoft QuickGelu: x * sigmoid(alpha * x)."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C

_FLOATS = ("float", "float16", "bfloat16", "double")


@kernel("QuickGelu", domain="com.microsoft", dtypes=_FLOATS)
def quick_gelu(node: NodeInfo, xp: Any):
    alpha = float(node.attr("alpha", 1.702))

    def run(x):
        v = C.up(x, xp)
        return ((v * C.sigmoid(alpha * v, xp)).astype(x.dtype),)

    return run
