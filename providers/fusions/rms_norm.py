"""RMS normalisation from primitives -> SimplifiedLayerNormalization(x, scale).

``x * 1/sqrt(mean(x^2, -1) + eps) * scale``, as PyTorch exports a hand-written
RMSNorm (LLaMA, Qwen, Mistral): Pow(x, 2) -> ReduceMean(last axis, keepdims)
-> Add(eps) -> Sqrt -> Reciprocal (or Div(1, .)) -> Mul(x, .) -> Mul(., scale).

Rules, in order: onnxscript's ``RmsNormFusion`` (its two multiplication
orders; it also takes the mixed-precision form that casts x to float32 first
and the result back, but only when the statistics are float32 or float64),
then ours for what it does not take: the ``Div(1, .)`` form, ReduceMean with
its axes as an attribute (opsets before 18) or as ``[rank - 1]``, size-1
constants, and float16/bfloat16 computed in their own type.

Tolerance-level: the fused kernel accumulates in float32 and rounds once,
where the primitives round after every op (a float16 graph after each of
seven ops; even float32 sums in another order). Tested with the dtype's
tolerance, not for equality.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import rms_normalization

from . import rule_checks as C
from .pattern_pass import PatternFusionPass


class _RMSNormPrimitives(pattern.RewriteRuleClassBase):
    """The primitive chain in x's own float type, with the variants exporters emit."""

    def __init__(self, name: str, div: bool) -> None:
        super().__init__(name)
        self._div = div

    def pattern(self, op, x, two, epsilon, one, scale):
        mean = op.ReduceMean(
            op.Pow(x, two),
            _allow_other_inputs=True,
            _allow_other_attributes=True,
            _outputs=["mean"],
        )
        rms = op.Sqrt(op.Add(mean, epsilon))
        inv = op.Div(one, rms) if self._div else op.Reciprocal(rms)
        return op.Mul(op.Mul(x, inv), scale)

    def check(self, context, x, two, epsilon, one, scale, mean, **_) -> pattern.MatchResult:
        return C.verdict(
            C.floats(x, scale),
            None if C.scalar(two) == 2.0 else "the exponent is not the constant 2",
            None if C.scalar(epsilon) is not None else "epsilon is not a constant scalar",
            None if not self._div or C.scalar(one) == 1.0 else "the numerator is not 1",
            _mean_over_last_axis(mean.producer(), x),
            C.vector_over_last_axis(scale, x, "scale"),
        )

    def rewrite(self, op, x, epsilon, scale, **_):
        return op.SimplifiedLayerNormalization(
            x, scale, axis=-1, epsilon=C.scalar(epsilon), stash_type=1
        )


def _mean_over_last_axis(mean: ir.Node, x: ir.Value) -> str | None:
    keep = mean.attributes.get("keepdims")
    if keep is not None and keep.value == 0:
        return "the mean drops its axis (keepdims=0)"
    if "axes" in mean.attributes:
        axes = list(mean.attributes["axes"].value)
    elif len(mean.inputs) > 1 and (arr := C.const(mean.inputs[1])) is not None:
        axes = [int(a) for a in arr.reshape(-1)]
    else:
        return "the mean's axes are not constant"
    r = C.rank(x)
    if len(axes) != 1 or not (axes[0] == -1 or (r is not None and axes[0] == r - 1)):
        return f"the mean is over axes {axes}, not the last axis alone"
    return None


class FuseRMSNorm(PatternFusionPass):
    """RMSNorm from primitives -> SimplifiedLayerNormalization. Tolerance-level (see module)."""

    name = "fuse_rms_norm"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        # Fresh rule objects per pass: onnxscript's rules keep state between check and
        # rewrite, and sessions may be created on several threads at once.
        library = [
            rms_normalization.RmsNormFusion.rule("RmsNormFusion1", _mul_order=False),
            rms_normalization.RmsNormFusion.rule("RmsNormFusion2", _mul_order=True),
        ]
        ours = [
            _RMSNormPrimitives.rule("rms_norm_reciprocal", div=False),
            _RMSNormPrimitives.rule("rms_norm_div", div=True),
        ]
        return [*library, *pattern.RewriteRuleSet(ours, commute=True).rules]
