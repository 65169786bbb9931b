"""com.microsoft FastGelu: tanh-approximated Gelu of X (+ optional bias)."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C

_FLOATS = ("float", "float16", "bfloat16", "double")


@kernel("FastGelu", domain="com.microsoft", dtypes=_FLOATS)
def fast_gelu(node: NodeInfo, xp: Any):
    def run(x, bias=None):
        v = C.up(x, xp)
        if bias is not None:
            v = v + C.up(bias, xp)
        return (C.gelu_tanh(v, xp).astype(x.dtype),)

    return run
