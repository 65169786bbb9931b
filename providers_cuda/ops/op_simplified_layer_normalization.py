"""SimplifiedLayerNormalization (RMSNorm) on CUDA: one ``norm_rows`` launch per node.

Registered in the default domain (where onnxruntime-genai's builder emits it)
and in com.microsoft, as on the CPU. float32/float16 with a scale of X's type
over the normalised dims take the kernel (``norm_runners``); stash_type=11
(double statistics), mixed types and broadcast scales run the generic kernel
on the device.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_simplified_layer_normalization as generic

from .norm_cuda import RMS
from .norm_runners import axis_norm_runner

NORM_TYPES = generic.NORM_TYPES


@kernel("SimplifiedLayerNormalization", since=1, dtypes=NORM_TYPES)
@kernel("SimplifiedLayerNormalization", since=1, domain="com.microsoft", dtypes=NORM_TYPES)
def simplified_layer_normalization(node: NodeInfo, xp: Any):
    return axis_norm_runner(node, xp, generic.simplified_layer_normalization(node, xp), RMS)
