"""SimplifiedLayerNormalization (RMSNorm) on NumPy: float32 over the last axis, fast."""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_simplified_layer_normalization import (
    NORM_TYPES,
)
from onnxep.providers.ops.op_simplified_layer_normalization import (
    simplified_layer_normalization as generic,
)

from .rms_cpu import fast_ok, rms_scaled


@kernel("SimplifiedLayerNormalization", since=1, dtypes=NORM_TYPES)
@kernel("SimplifiedLayerNormalization", since=1, domain="com.microsoft", dtypes=NORM_TYPES)
def simplified_layer_normalization(node, xp):
    general = generic(node, xp)
    eps = float(node.attr("epsilon", 1e-5))
    axis = int(node.attr("axis", -1))
    if node.num_outputs > 1 and node.has_output(1) or int(node.attr("stash_type", 1)) != 1:
        return general

    def run(x, scale):
        if (axis == -1 or axis == x.ndim - 1) and fast_ok(x, scale):
            return (rms_scaled(x, scale, eps),)
        return general(x, scale)

    return run
