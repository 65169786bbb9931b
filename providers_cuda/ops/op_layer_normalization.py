"""LayerNormalization (opset 17) on CUDA: one ``norm_rows`` launch per node.

Mean and variance in float32 (two passes, as the CPU's moments), then
``((x - mean) * inv)`` rounded to X's type before the scale and bias, as the
spec's second stage and the CPU kernel do. float32/float16 with Scale and B
of X's type over the normalised dims take the kernel (``norm_runners``);
stash_type=11, mixed types and broadcast operands run the generic kernel on
the device.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_layer_normalization as generic

from .norm_cuda import ONNX_LAYER
from .norm_runners import axis_norm_runner


@kernel("LayerNormalization", since=17)
def layer_normalization(node: NodeInfo, xp: Any):
    return axis_norm_runner(node, xp, generic.layer_normalization(node, xp), ONNX_LAYER)
