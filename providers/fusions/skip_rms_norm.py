"""Residual Add before an RMS norm -> com.microsoft SkipSimplifiedLayerNormalization.

``s = a + b; y = RMSNorm(s)`` where ``s`` also feeds the next residual Add
becomes one node with two outputs used: ``y`` (output 0) and the sum ``s``
(output 3, ``input_skip_bias_sum``). Rules: onnxscript's ``SkipRmsNormFusion``
over SimplifiedLayerNormalization (with and without a bias Add, which is what
``fuse_rms_norm`` emits, so that pass runs first), and ours over ONNX's own
RMSNormalization (opset 23), which onnxscript has no rule for.

Tolerance-level for ``y`` (the kernel normalises the float32 sum, where the
unfused graph normalises the sum rounded to the storage type); the sum output
is rounded once from the same float32 addition as the Add, so it is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import skip_normalization

from . import rule_checks as C
from .pattern_pass import PatternFusionPass


class _SkipRMSNormalization(pattern.RewriteRuleClassBase):
    """Add(a, b) -> RMSNormalization(last axis, float32 statistics), the sum kept."""

    def pattern(self, op, a, b, scale):
        total = op.Add(a, b)
        norm = op.RMSNormalization(total, scale, _allow_other_attributes=True, _outputs=["norm"])
        return norm, total

    def check(self, context, a, b, scale, norm, **_) -> pattern.MatchResult:
        node = norm.producer()
        stash = node.attributes.get("stash_type")
        return C.verdict(
            C.floats(a, b, scale),
            C.same_shape(a, b),
            None if C.last_axis(node, a) else "the norm is not over the last axis alone",
            None if stash is None or stash.value == 1 else "statistics are not float32",
            C.vector_over_last_axis(scale, a, "scale"),
        )

    def rewrite(self, op, a, b, scale, norm, **_):
        eps = norm.producer().attributes.get("epsilon")
        y, _mean, _inv, total = op.SkipSimplifiedLayerNormalization(
            a,
            b,
            scale,
            epsilon=1e-5 if eps is None else eps.value,
            _outputs=4,
            _domain="com.microsoft",
        )
        return y, total


class FuseSkipRMSNorm(PatternFusionPass):
    """Add + RMS norm -> SkipSimplifiedLayerNormalization. Tolerance-level (see module)."""

    name = "fuse_skip_rms_norm"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        rule = skip_normalization.SkipRmsNormFusion.rule
        return [
            rule("SkipRmsNormPreBias", has_bias=True, bias_pre_add=True),
            rule("SkipRmsNormBias", has_bias=True, bias_pre_add=False),
            rule("SkipRmsNorm", has_bias=False),
            _SkipRMSNormalization.rule("SkipRMSNormalization"),
        ]
