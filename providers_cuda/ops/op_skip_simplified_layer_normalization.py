"""com.microsoft SkipSimplifiedLayerNormalization on CUDA: one ``norm_rows`` launch per node.

RMSNorm(input + skip + bias) * gamma with the optional outputs (mean, zeros
for RMSNorm, inv_std_var and input_skip_bias_sum) written by the same launch.
onnxruntime-genai's builder emits it only in com.microsoft, which is where the
CPU provider registers it too. float32/float16 with skip a trailing block of
the input and gamma/bias one row take the kernel (``norm_runners``); other
broadcasts and mixed types run the generic kernel on the device.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_skip_simplified_layer_normalization as generic

from .norm_cuda import RMS
from .norm_runners import skip_norm_runner


@kernel(
    "SkipSimplifiedLayerNormalization",
    domain="com.microsoft",
    dtypes=("float", "float16", "bfloat16", "double"),
)
def skip_simplified_layer_normalization(node: NodeInfo, xp: Any):
    general = generic.skip_simplified_layer_normalization(node, xp)
    return skip_norm_runner(node, xp, general, RMS)
