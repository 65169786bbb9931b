"""Output dtypes of the contrib ops onnxep has kernels for, as each op's spec and kernel give them.

onnx's shape inference knows no com.microsoft schema, so it leaves every
output of such a node untyped, and with it everything downstream. Each rule
here names, per output, where its element type comes from: an input (the
first of several candidates that is wired decides; an optional input comes
first when the kernel prefers it, like a KV cache's past), or a fixed type.
The rules say what the kernels compute when no type is declared (their
``out_dtype`` fallbacks), so typing a value never changes what a kernel does.

``UNTYPED`` lists the contrib ops with a CPU kernel that get no rule, and why;
a test holds every such op to one of the two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

MS = "com.microsoft"
EP = "onnxep"


@dataclass(frozen=True)
class FromInput:
    """The dtype of the first wired input among ``candidates`` (untyped if that one is)."""

    candidates: tuple[int, ...]
    same_shape: bool = False  # the output also has that input's shape


@dataclass(frozen=True)
class Fixed:
    dtype: ir.DataType


#: An output rule, or a function of the node giving one (for attribute-dependent types).
Rule = FromInput | Fixed | Callable[[ir.Node], "FromInput | Fixed"]


def _like(*candidates: int, same_shape: bool = False) -> FromInput:
    return FromInput(tuple(candidates), same_shape)


def _stash(node: ir.Node) -> Fixed:
    """SimplifiedLayerNormalization's inv_std_var: double for stash_type 11, else float."""
    attr = node.attributes.get("stash_type")
    stash = 1 if attr is None else int(attr.value)
    return Fixed(ir.DataType.DOUBLE if stash == 11 else ir.DataType.FLOAT)


_X = _like(0, same_shape=True)  # output 0 is input 0's type and shape
_F32 = Fixed(ir.DataType.FLOAT)
_I32 = Fixed(ir.DataType.INT32)


def _wired(i: int, otherwise: Fixed) -> Callable[[ir.Node], FromInput | Fixed]:
    """Input ``i``'s type when it is wired, else ``otherwise`` (the kernel's fallback)."""

    def rule(node: ir.Node) -> FromInput | Fixed:
        wired = i < len(node.inputs) and node.inputs[i] is not None
        return _like(i) if wired else otherwise

    return rule


#: (domain, op_type) -> one rule per output, in output order.
RULES: dict[tuple[str, str], tuple[Rule, ...]] = {
    (MS, "Attention"): (_like(0), _like(0)),
    (MS, "BiasGelu"): (_X,),
    (MS, "CausalConvWithState"): (_X, _like(3, 0), _like(0)),  # present state: past's, else x's
    (MS, "FastGelu"): (_X,),
    (MS, "FusedConv"): (_like(0),),
    (MS, "FusedMatMul"): (_like(0),),
    (MS, "GatedRMSNorm"): (_X,),
    (MS, "GatherBlockQuantized"): (_like(2),),  # dequantized to the scales' type
    (MS, "Gelu"): (_X,),
    # present key/value keep the past cache's type, else the new key's (else the packed query's)
    (MS, "GroupQueryAttention"): (_like(0), _like(3, 1, 0), _like(4, 2, 0), _like(0)),
    (MS, "LinearAttention"): (_like(0), _like(3, 0)),
    (MS, "LinearAttentionGate"): (_like(0), _like(0)),
    (MS, "MatMulNBits"): (_like(0),),  # A's type; the shape needs the N attribute
    (MS, "MRotaryEmbedding"): (_X,),
    (MS, "MultiHeadAttention"): (_like(0), _like(0), _like(0)),
    (MS, "QuickGelu"): (_X,),
    (MS, "RotaryEmbedding"): (_X,),
    # Y takes the scale's type when none is declared (the kernel's fallback), not X's.
    (MS, "SimplifiedLayerNormalization"): (_like(1), _stash),
    ("", "SimplifiedLayerNormalization"): (_like(1), _stash),
    # output, mean, inv_std_var (float statistics), input_skip_bias_sum
    (MS, "SkipLayerNormalization"): (_X, _F32, _F32, _X),
    (MS, "SkipSimplifiedLayerNormalization"): (_X, _F32, _F32, _X),
    # quantized ops (providers_cpu/ops): 8-bit outputs keep their input's type, products
    # scaled back to float are float32
    (MS, "DecoderMaskedMultiHeadAttention"): (_like(0), _like(0), _like(0), _like(0)),
    (MS, "DequantizeLinear"): (_like(1),),  # the scale's type
    (MS, "DynamicQuantizeLSTM"): (_like(0), _like(0), _like(0)),
    (MS, "DynamicQuantizeMatMul"): (_F32,),
    (MS, "EmbedLayerNormalization"): (_F32, _I32, _F32),
    (MS, "FusedGemm"): (_like(0),),
    (MS, "Inverse"): (_X,),
    (MS, "MatMulBnb4"): (_like(0),),
    (MS, "MatMulInteger16"): (_I32,),
    (MS, "MatMulIntegerToFloat"): (_F32,),
    (MS, "MoE"): (_X,),
    (MS, "NhwcMaxPool"): (_like(0),),
    (MS, "QAttention"): (_F32, _F32),
    (MS, "QEmbedLayerNormalization"): (_F32, _I32),
    (MS, "QGemm"): (_wired(8, _F32),),  # y_zero_point's type, float without it
    (MS, "QLinearAdd"): (_like(0),),
    (MS, "QLinearAveragePool"): (_like(0),),
    (MS, "QLinearConcat"): (_like(1),),  # Y_zero_point's type
    (MS, "QLinearConv"): (_wired(7, Fixed(ir.DataType.UINT8)),),
    (MS, "QLinearGlobalAveragePool"): (_like(0),),
    (MS, "QLinearLeakyRelu"): (_X,),
    (MS, "QLinearMul"): (_like(0),),
    (MS, "QLinearSigmoid"): (_X,),
    (MS, "QLinearSoftmax"): (_X,),
    (MS, "QLinearWhere"): (_like(1),),
    (MS, "QMoE"): (_X,),
    (MS, "QuantizeLinear"): (_wired(2, Fixed(ir.DataType.UINT8)),),
    (MS, "SparseAttention"): (_like(0), _like(0), _like(0)),
    (MS, "Tokenizer"): (Fixed(ir.DataType.STRING),),
    (MS, "TransposeMatMul"): (_like(0),),
    # ONNX Attention-23's types: Y and qk as Q (T1), present key as K (T1), value as V (T2)
    (EP, "Attention"): (_like(0), _like(4, 1), _like(5, 2), _like(0)),
    (EP, "ConvIntegerToFloat"): (_F32,),
    # float32 elementwise steps; the shape is every input's broadcast
    (EP, "ElementwiseChain"): (_like(0),),
    (EP, "FusedConv"): (_like(0),),  # com.microsoft FusedConv with more activations
    # h in the previous state's type; no shape: the NumPy path broadcasts as the unfused
    # nodes did
    (EP, "GRUCell"): (_like(2),),
    (EP, "GatedLinearAttention"): (_like(0), _like(3, 0)),  # as LinearAttention
    # h and c in the cell state's type; no shape: the NumPy path broadcasts as the
    # unfused nodes did
    (EP, "LSTMCell"): (_like(1), _like(1)),
    (EP, "MatMulBias"): (_like(0),),
    (EP, "MatMulNBits"): (_like(0),),  # as com.microsoft's (half N with swiglu)
    (EP, "MatMulNT"): (_like(0),),  # A's type; the width is Wt's rows (or half, with swiglu)
    # the GEMV's output in x's type; the residual sum x's type and shape
    (EP, "NormMatMulNBits"): (_like(0), _X),
    (EP, "NormMatMulNT"): (_like(0), _X),
    (EP, "Rsqrt"): (_X,),
    (EP, "SiLU"): (_X,),
    (EP, "SwiGLU"): (_like(0),),
}

#: Contrib ops with a CPU kernel and no rule, and why they stay untyped.
UNTYPED: dict[tuple[str, str], str] = {}


def output_rules(node: ir.Node) -> tuple[FromInput | Fixed, ...] | None:
    """The rule for each output of ``node``, or None when its op has none."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    rules = RULES.get((domain, node.op_type))
    if rules is None:
        return None
    return tuple(r(node) if callable(r) else r for r in rules)


def resolve(rule: FromInput | Fixed, node: ir.Node) -> tuple[ir.DataType | None, ir.Shape | None]:
    """The dtype (and shape, where the rule gives it) ``rule`` assigns to an output of ``node``."""
    if isinstance(rule, Fixed):
        return rule.dtype, None
    for i in rule.candidates:
        v = node.inputs[i] if i < len(node.inputs) else None
        if v is not None:
            return v.dtype, (v.shape if rule.same_shape else None)
    return None, None
