"""SimplifiedLayerNormalization (RMSNorm): Y = X / sqrt(mean(X^2) + epsilon) * scale.

onnxruntime-genai's builder emits it in the default domain, where ONNX has no
schema for it, so it is registered there and in com.microsoft.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C

NORM_TYPES = ("float", "float16", "bfloat16", "double")


@kernel("SimplifiedLayerNormalization", since=1, dtypes=NORM_TYPES)
@kernel("SimplifiedLayerNormalization", since=1, domain="com.microsoft", dtypes=NORM_TYPES)
def simplified_layer_normalization(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", -1))
    eps = float(node.attr("epsilon", 1e-5))
    stash_type = int(node.attr("stash_type", 1))
    # stash_type 11 (double) asks for double statistics; everything else stays float32.
    stash = np.float64 if stash_type == 11 else np.float32
    inv_dtype = C.out_dtype(node, 1, stash)
    want_inv = node.has_output(1)

    def run(x, scale):
        r = x.ndim
        a = axis + r if axis < 0 else axis
        if not 0 <= a < r:
            raise ValueError(f"SimplifiedLayerNormalization: axis {axis} out of range for rank {r}")
        cdt = np.float64 if (x.dtype == np.float64 or stash == np.float64) else np.float32
        xf = C.up(x, xp, cdt)
        normed, inv = C.rms_norm(xf, tuple(range(a, r)), eps, xp)
        y = normed * C.up(scale, xp, cdt)
        ydt = C.out_dtype(node, 0, scale.dtype)
        outs = {0: C.down(y, ydt)}
        if want_inv:
            outs[1] = C.down(inv, inv_dtype)
        return C.pad_outputs(node, outs)

    return run
