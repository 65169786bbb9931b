"""com.microsoft Gelu: x * Phi(x) with the exact (erf) normal CDF."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C

_FLOATS = ("float", "float16", "bfloat16", "double")


@kernel("Gelu", domain="com.microsoft", dtypes=_FLOATS)
def gelu(node: NodeInfo, xp: Any):
    def run(x):
        return (C.gelu_erf(C.up(x, xp), xp).astype(x.dtype),)

    return run
