"""com.microsoft SkipLayerNormalization: LayerNorm(input + skip + bias) * gamma + beta."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C


@kernel(
    "SkipLayerNormalization",
    domain="com.microsoft",
    dtypes=("float", "float16", "bfloat16", "double"),
)
def skip_layer_normalization(node: NodeInfo, xp: Any):
    return C.skip_norm_builder(node, xp, simplified=False)
