"""com.microsoft SkipLayerNormalization on CUDA: one ``norm_rows`` launch per node.

LayerNorm(input + skip + bias) * gamma + beta in float32, rounded once, with
the optional outputs (mean, inv_std_var, input_skip_bias_sum) written by the
same launch, as the CPU kernel computes them. float32/float16 with skip a
trailing block of the input and gamma/beta/bias one row take the kernel
(``norm_runners``); other broadcasts and mixed types run the generic kernel
on the device.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_skip_layer_normalization as generic

from .norm_cuda import LAYER
from .norm_runners import skip_norm_runner


@kernel(
    "SkipLayerNormalization",
    domain="com.microsoft",
    dtypes=("float", "float16", "bfloat16", "double"),
)
def skip_layer_normalization(node: NodeInfo, xp: Any):
    return skip_norm_runner(node, xp, generic.skip_layer_normalization(node, xp), LAYER)
