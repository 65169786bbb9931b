"""com.microsoft SkipSimplifiedLayerNormalization: RMSNorm(input + skip + bias) * gamma."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C


@kernel(
    "SkipSimplifiedLayerNormalization",
    domain="com.microsoft",
    dtypes=("float", "float16", "bfloat16", "double"),
)
def skip_simplified_layer_normalization(node: NodeInfo, xp: Any):
    return C.skip_norm_builder(node, xp, simplified=True)
