"""Layer normalisation from primitives -> LayerNormalization(x, scale[, bias]).

``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * scale (+ bias)`` over the last
axis, as exporters write a LayerNorm they do not map to the op (paddle2onnx's SVTR
neck, older torch exports): ReduceMean -> Sub(x, .) -> Pow(., 2) or Mul(d, d) ->
ReduceMean -> Add(eps) -> Sqrt -> Div(d, .) -> Mul(scale) [-> Add(bias)]. Eight or nine
nodes, two of them reductions, become one kernel of a few whole-array passes.

onnxscript's ``LayerNormFusion`` takes only ReduceMean's axes as an input (opset 18)
and the Reciprocal form; these rules take the axes as an attribute or an input (the
last axis alone, ``keepdims`` on), either squaring and a size-1 epsilon; a bias Add after
the norm goes into the node (a rule of its own, as onnxscript's). The emitted op is
LayerNormalization in the default domain, which the CPU provider (as onnxruntime) runs
at every opset.

float32 only (``stash_type`` 1 computes in float32; a float64 graph would lose
precision). Tolerance-level: the kernel sums the squares in another order than the
primitives and multiplies by the reciprocal of the deviation.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from . import rule_checks as C
from .pattern_pass import PatternFusionPass
from .rms_norm import _mean_over_last_axis


class _LayerNormPrimitives(pattern.RewriteRuleClassBase):
    """The primitive chain; ``square`` "pow" or "mul"."""

    def __init__(self, name: str, square: str) -> None:
        super().__init__(name)
        self._square = square

    def pattern(self, op, x, two, epsilon, scale):
        mean = op.ReduceMean(
            x, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["mean"]
        )
        d = op.Sub(x, mean)
        sq = op.Pow(d, two) if self._square == "pow" else op.Mul(d, d)
        var = op.ReduceMean(
            sq, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["var"]
        )
        return op.Mul(op.Div(d, op.Sqrt(op.Add(var, epsilon))), scale)

    def check(self, context, x, two, epsilon, scale, mean, var, **_):
        return C.verdict(
            None if x.dtype == ir.DataType.FLOAT else f"dtype {C.dtype_name(x)} is not float32",
            C.floats(x, scale),
            None if self._square != "pow" or C.scalar(two) == 2.0 else "the exponent is not 2",
            None if C.scalar(epsilon) is not None else "epsilon is not a constant scalar",
            _mean_over_last_axis(mean.producer(), x),
            _mean_over_last_axis(var.producer(), x),
            C.vector_over_last_axis(scale, x, "scale"),
        )

    def rewrite(self, op, x, epsilon, scale, **_):
        return op.LayerNormalization(x, scale, axis=-1, epsilon=C.scalar(epsilon), stash_type=1)


class _LayerNormBias(pattern.RewriteRuleClassBase):
    """LayerNormalization(x, scale) + bias -> LayerNormalization(x, scale, bias): the add the
    kernel makes in its last pass (the same float32 additions)."""

    def pattern(self, op, x, scale, bias):
        return op.Add(op.LayerNormalization(x, scale, _outputs=["normalized"]), bias)

    def check(self, context, x, scale, bias, normalized, **_):
        node = normalized.producer()
        return C.verdict(
            None if x.dtype == ir.DataType.FLOAT else f"dtype {C.dtype_name(x)} is not float32",
            C.floats(x, bias),
            None if len(node.outputs) == 1 else "the norm's mean or deviation is read",
            None if C.last_axis(node, x) else "the norm is not over the last axis alone",
            C.vector_over_last_axis(bias, x, "bias"),
        )

    def rewrite(self, op, x, scale, bias, normalized, **_):
        return op.LayerNormalization(x, scale, bias, **normalized.producer().attributes)


class FuseLayerNorm(PatternFusionPass):
    """LayerNorm from primitives -> LayerNormalization. Tolerance-level (see module)."""

    name = "fuse_layer_norm"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        # Fresh rule objects per pass (onnxscript's rules keep state between check and
        # rewrite). The pass walks the nodes in order, so the norm is made at its Mul and
        # the bias rule finds it when it reaches the Add.
        ours = [
            _LayerNormPrimitives.rule("layer_norm_pow", square="pow"),
            _LayerNormPrimitives.rule("layer_norm_mul", square="mul"),
            _LayerNormBias.rule("layer_norm_bias"),
        ]
        return pattern.RewriteRuleSet(ours, commute=True).rules
