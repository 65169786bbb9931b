"""Fusion passes any provider can contribute (``extended`` level), one fusion per module.

Each matches structure and dtypes only (never a model family or size), refuses
when an intermediate value escapes to another consumer or is a graph output,
emits an op only where the bound provider has a kernel for it, and reports how
often it fired and which matches it refused and why. Most are onnxscript
rewrite rules run by :class:`PatternFusionPass`; each pass's docstring says
whether the fused node is byte-identical to what it replaces (``exact``) or
equal within the dtype's tolerance.
"""

from .attention import FuseAttention
from .bias_gelu import FuseBiasGelu
from .conv_activation import FuseConvActivation
from .conv_integer_to_float import FuseConvIntegerToFloat
from .dynamic_quantize_matmul import FuseDynamicQuantizeMatMul
from .gelu import FuseGelu
from .gru_cell import FuseGRUCell
from .layer_norm import FuseLayerNorm
from .linear_attention_gates import FuseLinearAttentionGates
from .linear_attention_l2_norm import FuseLinearAttentionL2Norm
from .lstm_cell import FuseLSTMCell
from .matmul_bias import FuseMatMulBias
from .norm_matmul import FuseNormMatMul
from .pattern_pass import PatternFusionPass
from .quantized_swiglu import FuseQuantizedSwiGLU
from .reporting import ReportingFusionPass
from .rms_norm import FuseRMSNorm
from .rsqrt import FuseRsqrt
from .shared_input_matmuls import FuseSharedInputMatMuls
from .silu import FuseSiLU
from .skip_rms_norm import FuseSkipRMSNorm
from .step_gemms import FuseStepGemms
from .swiglu import FuseSwiGLU
from .transposed_weights import FuseTransposedWeights


def standard_fusions() -> list[ReportingFusionPass]:
    """Fresh instances of every fusion here, in the order they must run.

    Larger patterns go first so a smaller one cannot take part of them: the
    RMS norm before its skip variant and before Rsqrt (which would take its
    Sqrt -> Reciprocal), SiLU before SwiGLU, GELU before its bias, a bias
    GELU before MatMul + bias (attention before it too: its MatMuls read two
    activations, which MatMulBias never takes), and the shared-input MatMuls
    after those, since they read what SwiGLU and MatMulBias became. The
    LinearAttention gate fold comes last, and its L2-norm fold after it: that
    one only folds into the gated node the first made. Weights are transposed
    after them, for the MatMuls the joins left (and a packed SwiGLU folds into its
    gate/up product there), a packed SwiGLU folds into its joined MatMulNBits
    next, and the norms fold into the GEMVs those made last.
    """
    return [
        FuseRMSNorm(),
        FuseSkipRMSNorm(),
        FuseRsqrt(),
        FuseSiLU(),
        FuseSwiGLU(),
        FuseGelu(),
        FuseBiasGelu(),
        FuseAttention(),
        FuseMatMulBias(),
        FuseSharedInputMatMuls(),
        FuseLinearAttentionGates(),
        FuseLinearAttentionL2Norm(),
        FuseTransposedWeights(),
        FuseQuantizedSwiGLU(),
        FuseNormMatMul(),
    ]


__all__ = [
    "FuseAttention",
    "FuseBiasGelu",
    "FuseConvActivation",
    "FuseConvIntegerToFloat",
    "FuseDynamicQuantizeMatMul",
    "FuseGelu",
    "FuseGRUCell",
    "FuseLayerNorm",
    "FuseLinearAttentionGates",
    "FuseLinearAttentionL2Norm",
    "FuseLSTMCell",
    "FuseMatMulBias",
    "FuseNormMatMul",
    "FuseQuantizedSwiGLU",
    "FuseRMSNorm",
    "FuseRsqrt",
    "FuseSharedInputMatMuls",
    "FuseSiLU",
    "FuseSkipRMSNorm",
    "FuseStepGemms",
    "FuseSwiGLU",
    "FuseTransposedWeights",
    "PatternFusionPass",
    "ReportingFusionPass",
    "standard_fusions",
]
