"""A bias Add before a GELU -> com.microsoft BiasGelu (erf form) or FastGelu(x, bias) (tanh).

onnxscript's ``BiasGeluFusion`` takes Add + Gelu (ONNX's, opset 20, and
com.microsoft's) into BiasGelu, and refuses the tanh approximation; ours take
Add + ONNX Gelu(approximate="tanh") and Add + FastGelu(x) into FastGelu with
its bias input. Runs after ``fuse_gelu`` and before ``fuse_matmul_bias``, so a
MatMul -> Add -> GELU chain puts its bias in the GELU kernel.

Tolerance-level: the kernels add the bias in float32 and round once.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import bias_gelu

from . import rule_checks as C
from .pattern_pass import PatternFusionPass


class _BiasTanhGelu(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, onnx_gelu: bool) -> None:
        super().__init__(name)
        self._onnx = onnx_gelu

    def pattern(self, op, x, bias):
        total = op.Add(x, bias)
        if self._onnx:
            return op.Gelu(total, approximate="tanh")
        return op.FastGelu(total, _domain="com.microsoft")

    def check(self, context, x, bias, **_) -> pattern.MatchResult:
        return C.verdict(
            C.floats(x, bias),
            C.vector_over_last_axis(bias, x, "bias"),
        )

    def rewrite(self, op, x, bias, **_):
        return op.FastGelu(x, bias, _domain="com.microsoft")


class FuseBiasGelu(PatternFusionPass):
    """Add(bias) + GELU -> BiasGelu / FastGelu(x, bias). Tolerance-level (see module)."""

    name = "fuse_bias_gelu"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        ours = [
            _BiasTanhGelu.rule("bias_gelu_tanh", onnx_gelu=True),
            _BiasTanhGelu.rule("bias_fast_gelu", onnx_gelu=False),
        ]
        library = [
            bias_gelu.BiasGeluFusion.rule("gelu_onnx_op", contrib_op=False),
            bias_gelu.BiasGeluFusion.rule("gelu_contrib_op", contrib_op=True),
        ]
        return [*pattern.RewriteRuleSet([*ours, *library], commute=True).rules]
