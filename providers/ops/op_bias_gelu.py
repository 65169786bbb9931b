"""com.microsoft BiasGelu: Gelu(A + B)."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C

_FLOATS = ("float", "float16", "bfloat16", "double")


@kernel("BiasGelu", domain="com.microsoft", dtypes=_FLOATS)
def bias_gelu(node: NodeInfo, xp: Any):
    def run(a, b):
        # The sum is formed in the compute dtype so fp16 inputs round only once.
        return (C.gelu_erf(C.up(a, xp) + C.up(b, xp), xp).astype(a.dtype),)

    return run
