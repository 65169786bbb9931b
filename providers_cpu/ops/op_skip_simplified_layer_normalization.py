"""SkipSimplifiedLayerNormalization on NumPy: the residual sum and its RMSNorm, float32, fast."""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_skip_simplified_layer_normalization import (
    skip_simplified_layer_normalization as generic,
)

from . import norms_jit
from .rms_cpu import fast_ok, rms_scaled


@kernel(
    "SkipSimplifiedLayerNormalization",
    domain="com.microsoft",
    dtypes=("float", "float16", "bfloat16", "double"),
)
def skip_simplified_layer_normalization(node, xp):
    general = generic(node, xp)
    if node.has_output(1) or node.has_output(2):
        return general
    eps = float(node.attr("epsilon", 1e-12))

    def run(x, skip, gamma, bias=None):
        if not fast_ok(x, gamma) or skip.dtype != x.dtype or skip.shape != x.shape:
            return general(x, skip, gamma, bias)
        if (
            norms_jit.enabled()
            and norms_jit.rows_ok(x, skip, gamma)
            and (bias is None or (bias.shape == gamma.shape and norms_jit.rows_ok(bias)))
        ):
            # the residual sum and its norm in one compiled pass (norms_jit)
            y, s = norms_jit.rms(x, gamma, eps, skip, bias)
            return (y, None, None, s)
        s = x + skip
        if bias is not None:
            s += bias
        y = rms_scaled(s, gamma, eps)
        return (y, None, None, s)

    return run
